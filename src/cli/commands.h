// Every `ferry` command; main.cc adds them in this order.
#pragma once

#include "cli/command.h"

namespace ferry::cli {

void add_gen_model_command(CLI::App& app, Dispatch& dispatch);
void add_advise_bucket_command(CLI::App& app, Dispatch& dispatch);
void add_inspect_command(CLI::App& app, Dispatch& dispatch);
void add_doctor_command(CLI::App& app, Dispatch& dispatch);
void add_explain_command(CLI::App& app, Dispatch& dispatch);
void add_convert_command(CLI::App& app, Dispatch& dispatch);
void add_trace_command(CLI::App& app, Dispatch& dispatch);
void add_sync_command(CLI::App& app, Dispatch& dispatch);
void add_demo_command(CLI::App& app, Dispatch& dispatch);
void add_bench_command(CLI::App& app, Dispatch& dispatch);
void add_ckpt_command(CLI::App& app, Dispatch& dispatch);

}  // namespace ferry::cli

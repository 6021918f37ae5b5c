// Every `ferry` command; main.cc adds them in this order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
void add_token_command(CLI::App& app, Dispatch& dispatch);
void add_plan_command(CLI::App& app, Dispatch& dispatch);

// cmd_ckpt_replicate.cc: `ckpt replicate` (added to `ckpt` by add_ckpt_command), and `ckpt
// verify` on verl / Megatron folders: the exit code, or nullopt when no argument is one.
void add_ckpt_verl_commands(CLI::App& ckpt, Dispatch& dispatch);
std::optional<int> run_megatron_verify(const std::vector<std::string>& args,
                                       std::optional<std::int64_t> step, bool as_json);

}  // namespace ferry::cli

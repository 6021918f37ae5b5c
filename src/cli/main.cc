// `ferry`: the command-line tool. Exit codes: 0 success, 1 failure, 2 usage error.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "cli/commands.h"

int main(int argc, char** argv) {
  // A peer that dies must surface as EPIPE on our next write, not kill us.
  std::signal(SIGPIPE, SIG_IGN);

  CLI::App app{"ferry: weight sync and checkpoints for RL post-training", "ferry"};
  app.require_subcommand(1);
  app.footer(
      "Run 'ferry <command> --help' for a command's options and an example.\n"
      "Logging: FERRY_LOG_LEVEL=trace|debug|info|warn|error (falls back to VERL_LOGGING_LEVEL).");
  app.set_version_flag("--version", std::string("ferry ") + FERRY_VERSION);

  ferry::cli::Dispatch dispatch;
  ferry::cli::add_gen_model_command(app, dispatch);
  ferry::cli::add_advise_bucket_command(app, dispatch);
  ferry::cli::add_inspect_command(app, dispatch);
  ferry::cli::add_doctor_command(app, dispatch);
  ferry::cli::add_explain_command(app, dispatch);
  ferry::cli::add_convert_command(app, dispatch);
  ferry::cli::add_trace_command(app, dispatch);
  ferry::cli::add_sync_command(app, dispatch);
  ferry::cli::add_demo_command(app, dispatch);
  ferry::cli::add_bench_command(app, dispatch);
  ferry::cli::add_ckpt_command(app, dispatch);
  ferry::cli::add_token_command(app, dispatch);
  ferry::cli::add_plan_command(app, dispatch);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? ferry::cli::kExitOk : ferry::cli::kExitUsage;
  }
  return dispatch.run ? dispatch.run() : ferry::cli::kExitUsage;
}

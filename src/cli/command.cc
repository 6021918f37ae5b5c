#include "cli/command.h"

#include <unistd.h>

#include <cstdio>

namespace ferry::cli {

CLI::App* add_command(CLI::App& app, Dispatch& dispatch, const std::string& name,
                      const std::string& description, const std::string& example,
                      std::function<int()> run) {
  CLI::App* sub = app.add_subcommand(name, description);
  sub->footer("Example:\n  " + example);
  sub->callback([&dispatch, run = std::move(run)] { dispatch.run = run; });
  return sub;
}

int report_error(const Status& status) {
  std::fprintf(stderr, "ferry: error: %s\n", status.to_string().c_str());
  return status.code() == Code::kInvalidArgument ? kExitUsage : kExitFailure;
}

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

}  // namespace ferry::cli

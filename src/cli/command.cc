#include "cli/command.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <string>

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
  return kExitFailure;
}

int usage_error(const Status& status) {
  std::fprintf(stderr, "ferry: usage error: %s\n", status.message().c_str());
  return kExitUsage;
}

int usage_error(const std::string& message) { return usage_error(invalid_argument(message)); }

Status check_host_port(const std::string& flag, const std::string& value) {
  std::string port;
  if (!value.empty() && value[0] == '[') {
    const auto close = value.find(']');
    if (close == std::string::npos || close + 1 >= value.size() || value[close + 1] != ':') {
      return invalid_argument(flag + " '" + value + "': write [ipv6]:port");
    }
    port = value.substr(close + 2);
  } else {
    const auto colon = value.rfind(':');
    if (colon == std::string::npos || colon == 0 || value.find(':') != colon) {
      return invalid_argument(flag + " '" + value + "': write host:port, e.g. 0.0.0.0:5555");
    }
    port = value.substr(colon + 1);
  }
  unsigned number = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || number > 65535) {
    return invalid_argument(flag + " '" + value + "': the port must be a number 0..65535");
  }
  return ok_status();
}

Status check_bucket_mb(const std::string& flag, std::uint64_t mb) {
  // 2^44 MiB would overflow the byte count; no machine has buckets that large.
  if (mb == 0 || mb > (std::uint64_t{1} << 40)) {
    return invalid_argument(flag + " " + std::to_string(mb) + ": give a positive size in MiB");
  }
  return ok_status();
}

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

}  // namespace ferry::cli

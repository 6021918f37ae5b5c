#include "tools/child_process.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstring>

#include "base/file_util.h"
#include "base/parse_number.h"

namespace ferry::tools {

Result<Subprocess> fork_child(const std::function<std::string()>& body, const std::string& what) {
  return Subprocess::fork(
      [&body](int out_fd) {
        const std::string out = body();
        return write_all(out_fd, as_bytes(out), "result pipe").ok() ? 0 : 1;
      },
      what);
}

Result<std::string> finish_child(Subprocess& child) {
  Subprocess::Finished done = child.finish(Deadline::never(), std::string::npos);
  if (done.exit.signal != 0) {
    return aborted(
        fmt::format("{} (pid {}) died of signal {}", child.name(), child.pid(), done.exit.signal));
  }
  if (done.exit.code != 0) {
    return aborted(
        fmt::format("{} (pid {}) exited with code {}", child.name(), child.pid(), done.exit.code));
  }
  return std::move(done.out);
}

namespace {

// "    1234 kB\n" -> 1234; 0 when the line is not that.
std::uint64_t leading_kb(std::string_view rest) {
  const std::size_t start = rest.find_first_not_of(" \t");
  if (start == std::string_view::npos) return 0;
  rest.remove_prefix(start);
  return parse_number<std::uint64_t>(rest.substr(0, rest.find_first_of(" \t\n"))).value_or(0);
}

}  // namespace

std::uint64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  std::uint64_t kb = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) kb = leading_kb(line + 6);
  }
  std::fclose(f);
  return kb * 1024;
}

CpuSeconds cpu_seconds() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return {};
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return {secs(u.ru_utime), secs(u.ru_stime)};
}

}  // namespace ferry::tools

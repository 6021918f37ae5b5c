#include "tools/child_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/file_util.h"

namespace ferry::tools {

Result<Child> fork_child(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return errno_status("pipe2", "child result", errno);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return errno_status("fork", "sync child", err);
  }
  if (pid == 0) {
    ::close(fds[0]);
    const std::string out = body();
    (void)write_all(fds[1], as_bytes(out), "result pipe");
    ::_exit(0);
  }
  ::close(fds[1]);
  return Child{pid, fds[0]};
}

Result<std::string> finish_child(Child child) {
  ScopedFd fd(child.out_fd);
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    return aborted(fmt::format("child {} died of signal {}", child.pid, WTERMSIG(status)));
  }
  return out;
}

std::uint64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  std::uint64_t kb = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::strtoull(line + 6, nullptr, 10);
  }
  std::fclose(f);
  return kb * 1024;
}

}  // namespace ferry::tools

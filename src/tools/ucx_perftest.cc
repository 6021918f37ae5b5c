#include "tools/ucx_perftest.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "base/file_util.h"

extern char** environ;

namespace ferry::tools {

Result<SpawnedProcess> spawn_process(const std::vector<std::string>& args,
                                     const std::vector<std::string>& extra_env) {
  if (args.empty()) return invalid_argument("spawn_process: no program");
  std::vector<std::string> env = extra_env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> a = args;
  std::vector<char*> argv;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return errno_status("pipe2", args[0], errno);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, p[1], 1);
  posix_spawn_file_actions_adddup2(&fa, p[1], 2);
  SpawnedProcess c;
  const int rc = ::posix_spawnp(&c.pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(p[1]);
  if (rc != 0) {
    ::close(p[0]);
    return errno_status("posix_spawnp", args[0], rc);
  }
  c.out_fd = p[0];
  return c;
}

std::string collect_process(SpawnedProcess p, int* wait_status) {
  ScopedFd fd(p.out_fd);
  std::string text;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  int st = 0;
  while (::waitpid(p.pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (wait_status != nullptr) *wait_status = st;
  return text;
}

void kill_process(SpawnedProcess p) {
  ::kill(p.pid, SIGKILL);
  (void)collect_process(p, nullptr);
}

int free_loopback_port() {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd.get() < 0 || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return 0;
  }
  return ntohs(a.sin_port);
}

PerftestResult ucx_perftest_loopback_once(std::size_t bytes, std::size_t iterations,
                                          const std::string& mode) {
  PerftestResult r;
  r.mode = mode;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string port = std::to_string(free_loopback_port());
    auto server = spawn_process({"ucx_perftest", "-p", port, "-e", "-E", mode});
    if (!server.ok()) {
      r.log = server.status().to_string() + " (Debian: apt-get install ucx-utils)";
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + 300 * attempt));
    auto client =
        spawn_process({"ucx_perftest", "127.0.0.1", "-p", port, "-e", "-E", mode, "-t", "tag_bw",
                       "-s", std::to_string(bytes), "-n", std::to_string(iterations), "-w", "2"});
    if (!client.ok()) {
      kill_process(*server);
      r.log = client.status().to_string();
      return r;
    }
    const std::string out = collect_process(*client, nullptr);
    kill_process(*server);
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Final:", 0) != 0) continue;
      // Final: iterations p50 avg overall bw-avg bw-overall rate-avg rate-overall
      std::istringstream f(line.substr(6));
      double v[8] = {};
      for (double& x : v) f >> x;
      r.gbps = v[5] * 1048576.0 / 1e9;  // perftest's MB is 2^20 bytes
      return r;
    }
    r.log = out;
  }
  return r;
}

PerftestResult ucx_perftest_loopback(std::size_t bytes, std::size_t iterations) {
  PerftestResult best;
  for (const char* mode : {"poll", "sleep"}) {
    PerftestResult one = ucx_perftest_loopback_once(bytes, iterations, mode);
    if (one.gbps > best.gbps) {
      best = std::move(one);
    } else if (best.gbps < 0) {
      best.log = one.log;
    }
  }
  return best;
}

}  // namespace ferry::tools

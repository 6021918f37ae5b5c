#include "tools/ucx_perftest.h"

#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "base/file_util.h"
#include "base/subprocess.h"

namespace ferry::tools {

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

namespace {

// User + system CPU seconds of the children reaped so far.
double children_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_CHILDREN, &u);
  const auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

}  // namespace

PerftestResult ucx_perftest_loopback_once(std::size_t bytes, std::size_t iterations,
                                          const std::string& mode, int warmup) {
  PerftestResult r;
  r.mode = mode;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string port = std::to_string(free_loopback_port());
    SpawnOptions merged;
    merged.output = ChildOutput::kMerged;
    auto server = Subprocess::spawn({"ucx_perftest", "-p", port, "-e", "-E", mode}, merged);
    if (!server.ok()) {
      r.log = server.status().to_string() + " (Debian: apt-get install ucx-utils)";
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + 300 * attempt));
    const double cpu_before = children_cpu_seconds();
    auto client = Subprocess::spawn(
        {"ucx_perftest", "127.0.0.1", "-p", port, "-e", "-E", mode, "-t", "tag_bw", "-s",
         std::to_string(bytes), "-n", std::to_string(iterations), "-w", std::to_string(warmup)},
        merged);
    if (!client.ok()) {
      r.log = client.status().to_string();
      return r;  // the server is killed as it goes out of scope
    }
    // The client is reaped first, then the server: what the children's CPU grows by at each
    // is that child's.
    const std::string out = client->finish().out;
    const double cpu_client = children_cpu_seconds();
    server->kill();
    const double cpu_server = children_cpu_seconds();
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Final:", 0) != 0) continue;
      // Final: iterations p50 avg overall bw-avg bw-overall rate-avg rate-overall
      std::istringstream f(line.substr(6));
      double v[8] = {};
      for (double& x : v) f >> x;
      r.gbps = v[5] * 1048576.0 / 1e9;  // perftest's MB is 2^20 bytes
      r.send_cpu_seconds = cpu_client - cpu_before;
      r.recv_cpu_seconds = cpu_server - cpu_client;
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

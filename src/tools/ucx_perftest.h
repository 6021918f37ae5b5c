// U, the limit a net round is measured against: UCX's own ucx_perftest on the same path at
// the same message size. Shared by `ferry bench sync --net` and bench/net_bench.cc.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::tools {

// A TCP port on 127.0.0.1 that was free a moment ago (bound, read back, closed).
int free_loopback_port();

struct PerftestResult {
  double gbps = -1;  // 10^9 bytes/s; < 0 when every attempt failed
  std::string mode;  // "poll" or "sleep": which -E mode gave gbps
  std::string log;   // the last failed attempt's output, for the error message
  // CPU seconds (user + system) of the client (it sends) and the server (it receives) over
  // their whole lives, start-up included.
  double send_cpu_seconds = 0;
  double recv_cpu_seconds = 0;
};

// ucx_perftest -t tag_bw -e (error handling on, as ferry's endpoints have it) at `bytes`,
// `iterations` messages after `warmup` (-w), server and client as children on 127.0.0.1,
// with -E `mode`. Retries on a fresh port up to three times (a port taken meanwhile, a slow
// server start). The CPU figures need no other child reaped meanwhile by this process.
inline constexpr int kPerftestWarmup = 2;
PerftestResult ucx_perftest_loopback_once(std::size_t bytes, std::size_t iterations,
                                          const std::string& mode, int warmup = kPerftestWarmup);
// The better of -E poll and -E sleep: on few shared cores two spinning processes starve
// loopback TCP's kernel copies, and ferry waits on the worker's event fd, so poll mode
// alone would understate the limit. Each moves (iterations + kPerftestWarmup) messages.
PerftestResult ucx_perftest_loopback(std::size_t bytes, std::size_t iterations);

}  // namespace ferry::tools

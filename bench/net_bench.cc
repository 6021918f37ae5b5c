// net_bench: the net transport's bulk path against UCX's own limit on the same path.
//
// For each bucket size it runs, in the same run and on 127.0.0.1:
//   U     = ucx_perftest -t tag_bw -e at that message size, server and client as child
//           processes, the better of -E poll and -E sleep (src/tools/ucx_perftest.h, shared
//           with `ferry bench sync --net`, says why);
//   ferry = N buckets through net::Channel::send_bulk / receive_bulk between this process
//           (receiver, listener) and a child (sender), K buckets in flight, ring slots
//           registered once, timed after --warmup buckets (default 1; ucx_perftest runs -w 2);
// and prints GB/s (10^9 bytes/s) for both, the ratio, the CPU seconds (user + system) each
// side spent per GB moved, and the sender's connect + authenticate time. GB/s is the best of
// --repeat runs (default 3): on a shared 2-core machine a run's figure says more about the
// neighbours than about either side. CPU s/GB moves less with the neighbours (though a busy
// machine moves loopback's receive processing to ksoftirqd, off both sides' bills); it is
// the lowest of the runs, per side. ferry's is measured by each process over its transfers
// (getrusage, all threads); ucx_perftest's is each child's whole life (getrusage of the reaped
// child) less that of a one-message run (start-up, UCX init), in -E sleep mode, which waits
// as ferry does (-E poll spins, so its CPU is its wall time).
// Usage: net_bench [--sizes-mib 4,64,256] [--total-mib 1024] [--inflight K] [--repeat R]
//                  [--warmup B] [--no-perftest].
// UCX_TLS / UCX_NET_DEVICES apply to both sides alike.
#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/subprocess.h"
#include "tools/ucx_perftest.h"
#include "transport/net/auth.h"
#include "transport/net/channel.h"

namespace {

using namespace ferry;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kTimeout{60000};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "net_bench: %s\n", what.c_str());
  std::exit(1);
}

void check(const Status& s, const char* what) {
  if (!s.ok()) die(std::string(what) + ": " + s.to_string());
}

std::string text_of(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

void fill_pattern(std::span<std::byte> out, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i + 8 <= out.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, 8);
  }
}

// CPU seconds (user + system) of `who` (RUSAGE_SELF, RUSAGE_CHILDREN) so far.
double cpu_seconds(int who) {
  rusage u{};
  ::getrusage(who, &u);
  const auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

// A child with stdout and stderr in one pipe, for its log in an error message.
Subprocess spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
  SpawnOptions options;
  options.env = extra_env;
  options.output = ChildOutput::kMerged;
  auto p = Subprocess::spawn(args, options);
  check(p.status(), "spawn");
  return std::move(*p);
}

// ---- ferry's side ----

struct FerryResult {
  double gbps = 0;
  double connect_ms = 0;
  double send_cpu_per_gb = 0;  // the sender's CPU seconds per 10^9 bytes
  double recv_cpu_per_gb = 0;  // the receiver's
  std::string transports;
};

// `warmup` buckets go before ferry's clock starts, as ucx_perftest's -w: on ferry's TCP path
// the first bucket of a channel is slow (docs/benchmarks.md, issue 33). Their CPU is counted:
// CPU per GB is over every bucket.
FerryResult ferry_run(std::size_t bytes, std::uint32_t timed, std::uint32_t warmup,
                      std::uint32_t inflight, const std::string& self) {
  const std::uint32_t count = timed + warmup;
  auto token_text = net::new_token_text();
  check(token_text.status(), "new_token_text");
  const std::string secret = *token_text;
  auto ctx = net::Context::create();
  check(ctx.status(), "net::Context::create");
  auto listener = net::Listener::bind(*ctx, "127.0.0.1:0", *net::Token::from_string(secret));
  check(listener.status(), "Listener::bind");
  Subprocess sender = spawn({self, "--child-sender", listener->address(), std::to_string(bytes),
                             std::to_string(count), std::to_string(inflight)},
                            {"FERRY_TOKEN=" + secret});
  auto ch = listener->accept(kTimeout);
  if (!ch.ok()) {
    sender.kill();
    die("accept: " + ch.status().to_string() + "\n" + sender.finish().out);
  }
  std::vector<std::byte> ring(static_cast<std::size_t>(inflight) * bytes);
  // Pre-fault, as a session's ring is faulted in once (DESIGN.md).
  std::memset(ring.data(), 0, ring.size());
  auto region = (*ctx)->register_memory(ring);
  check(region.status(), "register_memory");
  auto slot = [&](std::uint32_t b) {
    return std::span<std::byte>(ring).subspan((b % inflight) * bytes, bytes);
  };
  std::vector<net::Transfer> posted(inflight);
  for (std::uint32_t b = 0; b < std::min(count, inflight); ++b) {
    auto t = ch->receive_bulk(b, slot(b), *region);
    check(t.status(), "receive_bulk");
    posted[b] = std::move(*t);
  }
  check(ch->send(bytes_of("go"), kTimeout), "send go");
  auto start = Clock::now();  // restarted after the warm-up
  const double cpu_start = cpu_seconds(RUSAGE_SELF);
  for (std::uint32_t b = 0; b < count; ++b) {
    net::Transfer& t = posted[b % inflight];
    check(ch->wait(t, kTimeout), "bulk receive");
    if (t.bytes() != bytes) die("bucket " + std::to_string(b) + " arrived short");
    if (b + 1 == warmup) start = Clock::now();
    if (b + inflight < count) {
      auto next = ch->receive_bulk(b + inflight, slot(b + inflight), *region);
      check(next.status(), "receive_bulk");
      t = std::move(*next);
    }
  }
  const double secs = seconds_since(start);
  const double recv_cpu = cpu_seconds(RUSAGE_SELF) - cpu_start;
  auto report = ch->receive(kTimeout);
  check(report.status(), "sender report");
  FerryResult r;
  const double gb = static_cast<double>(bytes) * count / 1e9;
  r.gbps = static_cast<double>(bytes) * timed / 1e9 / secs;
  r.recv_cpu_per_gb = recv_cpu / gb;
  r.transports = ch->transports();
  std::uint64_t hash = 0;
  double send_cpu = 0;
  std::sscanf(text_of(*report).c_str(), "connect_ms=%lf cpu_s=%lf hash=%lu", &r.connect_ms,
              &send_cpu, &hash);
  r.send_cpu_per_gb = send_cpu / gb;
  // The last bucket in its slot must be what the sender put there: bit-exact or no figure.
  if (XXH3_64bits(slot(count - 1).data(), bytes) != hash)
    die("bucket bytes differ from the sender's");
  check(ch->send(bytes_of("bye"), kTimeout), "send bye");
  const Subprocess::Finished sender_done = sender.finish();
  if (sender_done.exit.code != 0) die("sender failed:\n" + sender_done.out);
  return r;
}

// ---- ucx_perftest's side ----

constexpr int kPerftestWarmup = 2;  // -w: messages before its clock starts

// One case's U: the best GB/s of -E poll and -E sleep, and -E sleep's CPU per GB with the
// start-up's taken off.
struct PerftestFigures {
  double gbps = -1;
  std::string mode = "-";
  double send_cpu_per_gb = -1;
  double recv_cpu_per_gb = -1;
  std::string log;
};

PerftestFigures perftest(std::size_t bytes, std::size_t iterations,
                         const tools::PerftestResult& startup) {
  PerftestFigures best;
  for (const char* mode : {"poll", "sleep"}) {
    const tools::PerftestResult one =
        tools::ucx_perftest_loopback_once(bytes, iterations, mode, kPerftestWarmup);
    if (one.gbps < 0) {
      best.log = one.log;
      continue;
    }
    if (one.gbps > best.gbps) {
      best.gbps = one.gbps;
      best.mode = mode;
    }
    if (std::string(mode) == "sleep") {
      const double gb = static_cast<double>(bytes) * (iterations + kPerftestWarmup) / 1e9;
      best.send_cpu_per_gb = std::max(0.0, one.send_cpu_seconds - startup.send_cpu_seconds) / gb;
      best.recv_cpu_per_gb = std::max(0.0, one.recv_cpu_seconds - startup.recv_cpu_seconds) / gb;
    }
  }
  return best;
}

int child_sender(const std::string& address, std::size_t bytes, std::uint32_t count,
                 std::uint32_t inflight) {
  auto ctx = net::Context::create();
  check(ctx.status(), "net::Context::create");
  auto token = net::Token::from_env();
  check(token.status(), "token");
  const auto t0 = Clock::now();
  auto ch = net::connect(*ctx, address, *token, kTimeout);
  const double connect_ms = seconds_since(t0) * 1e3;
  check(ch.status(), "connect");
  std::vector<std::byte> ring(static_cast<std::size_t>(inflight) * bytes);
  for (std::uint32_t s = 0; s < inflight; ++s) {
    fill_pattern(std::span<std::byte>(ring).subspan(s * bytes, bytes), s);
  }
  auto region = (*ctx)->register_memory(ring);
  check(region.status(), "register_memory");
  check(ch->receive(kTimeout).status(), "wait for go");
  const double cpu_start = cpu_seconds(RUSAGE_SELF);
  std::vector<net::Transfer> in_flight(inflight);
  for (std::uint32_t b = 0; b < count; ++b) {
    const std::uint32_t s = b % inflight;
    if (b >= inflight) check(ch->wait(in_flight[s], kTimeout), "bulk send");
    auto t = ch->send_bulk(b, std::span<const std::byte>(ring).subspan(s * bytes, bytes), *region);
    check(t.status(), "send_bulk");
    in_flight[s] = std::move(*t);
  }
  for (auto& t : in_flight) check(ch->wait(t, kTimeout), "bulk send");
  const double cpu = cpu_seconds(RUSAGE_SELF) - cpu_start;
  const std::uint32_t last = (count - 1) % inflight;
  const std::uint64_t hash = XXH3_64bits(ring.data() + last * bytes, bytes);
  char report[128];
  std::snprintf(report, sizeof report, "connect_ms=%.3f cpu_s=%.6f hash=%lu", connect_ms, cpu,
                static_cast<unsigned long>(hash));
  check(ch->send(bytes_of(report), kTimeout), "send report");
  check(ch->receive(kTimeout).status(), "wait for bye");
  return 0;
}

std::vector<std::size_t> parse_list(const std::string& s) {
  std::vector<std::size_t> out;
  std::istringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoul(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 5 && args[0] == "--child-sender") {
    return child_sender(args[1], std::stoul(args[2]),
                        static_cast<std::uint32_t>(std::stoul(args[3])),
                        static_cast<std::uint32_t>(std::stoul(args[4])));
  }
  std::vector<std::size_t> sizes_mib = {4, 64, 256};
  std::size_t total_mib = 1024;
  std::uint32_t inflight = 0;  // 0: 4, or 2 for buckets of 256 MiB and more
  int repeat = 3;
  std::uint32_t warmup = 1;
  bool run_perftest = true;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const bool has_value = i + 1 < args.size();
    if (args[i] == "--no-perftest") {
      run_perftest = false;
    } else if (args[i] == "--sizes-mib" && has_value) {
      sizes_mib = parse_list(args[++i]);
    } else if (args[i] == "--total-mib" && has_value) {
      total_mib = std::stoul(args[++i]);
    } else if (args[i] == "--inflight" && has_value) {
      inflight = static_cast<std::uint32_t>(std::stoul(args[++i]));
    } else if (args[i] == "--warmup" && has_value) {
      warmup = static_cast<std::uint32_t>(std::stoul(args[++i]));
    } else if (args[i] == "--repeat" && has_value) {
      repeat = std::max(1, std::stoi(args[++i]));
    } else {
      die("unknown option " + args[i] +
          " (--sizes-mib, --total-mib, --inflight, --repeat, --warmup, --no-perftest)");
    }
  }
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0) die("cannot find own binary");
  const char* tls = std::getenv("UCX_TLS");
  const char* path = std::getenv("FERRY_NET_PATH");
  std::printf(
      "net_bench: 127.0.0.1, FERRY_NET_PATH=%s, UCX_TLS=%s, ~%zu MiB per case, GB/s best of %d "
      "(ferry timed after %u warm-up buckets), CPU s/GB lowest of %d\n",
      path ? path : "(unset: tcp)", tls ? tls : "(unset)", total_mib, repeat, warmup, repeat);
  // ucx_perftest's start-up CPU (exec, UCX init, connect), taken off its figures below.
  tools::PerftestResult startup;
  if (run_perftest) {
    startup = tools::ucx_perftest_loopback_once(4096, 1, "sleep", 0);
    if (startup.gbps < 0) startup = tools::PerftestResult{};
  }
  std::printf("%-9s %5s %2s %8s %6s %8s %6s  %-23s  %-23s %8s  %s\n", "", "", "", "U", "", "ferry",
              "", "ferry CPU s/GB", "U CPU s/GB (sleep)", "", "");
  std::printf("%-9s %5s %2s %8s %6s %8s %6s  %11s %11s  %11s %11s %8s  %s\n", "bucket", "count",
              "K", "GB/s", "U mode", "GB/s", "ratio", "send", "recv", "send", "recv", "conn ms",
              "ferry transports");
  double worst_connect = 0;
  for (std::size_t mib : sizes_mib) {
    const std::size_t bytes = mib << 20;
    const auto count = static_cast<std::uint32_t>(std::max<std::size_t>(4, total_mib / mib));
    const std::uint32_t k = inflight != 0 ? inflight : (mib >= 256 ? 2 : 4);
    PerftestFigures u;
    FerryResult f;
    f.connect_ms = 1e9;
    f.send_cpu_per_gb = 1e9;
    f.recv_cpu_per_gb = 1e9;
    const auto lowest = [](double& keep, double x) {
      if (x >= 0 && (keep < 0 || x < keep)) keep = x;
    };
    for (int r = 0; r < repeat; ++r) {  // interleaved, so both see the same neighbours
      if (run_perftest) {
        const PerftestFigures one_u = perftest(bytes, count, startup);
        if (one_u.gbps > u.gbps) {
          u.gbps = one_u.gbps;
          u.mode = one_u.mode;
        }
        if (one_u.gbps < 0 && u.log.empty()) u.log = one_u.log;
        lowest(u.send_cpu_per_gb, one_u.send_cpu_per_gb);
        lowest(u.recv_cpu_per_gb, one_u.recv_cpu_per_gb);
      }
      const FerryResult one = ferry_run(bytes, count, warmup, k, self);
      f.gbps = std::max(f.gbps, one.gbps);
      f.connect_ms = std::min(f.connect_ms, one.connect_ms);
      f.send_cpu_per_gb = std::min(f.send_cpu_per_gb, one.send_cpu_per_gb);
      f.recv_cpu_per_gb = std::min(f.recv_cpu_per_gb, one.recv_cpu_per_gb);
      worst_connect = std::max(worst_connect, one.connect_ms);
      f.transports = one.transports;
    }
    const auto figure = [](double x, const char* fmt) {
      char text[32];
      if (x < 0) return std::string("-");
      std::snprintf(text, sizeof text, fmt, x);
      return std::string(text);
    };
    std::printf("%4zu MiB %6u %2u %8s %6s %8.3f %6s  %11.3f %11.3f  %11s %11s %8.1f  %s\n", mib,
                count, k,
                u.gbps > 0     ? figure(u.gbps, "%.3f").c_str()
                : run_perftest ? "failed"
                               : "-",
                u.mode.c_str(), f.gbps, u.gbps > 0 ? figure(f.gbps / u.gbps, "%.2f").c_str() : "-",
                f.send_cpu_per_gb, f.recv_cpu_per_gb, figure(u.send_cpu_per_gb, "%.3f").c_str(),
                figure(u.recv_cpu_per_gb, "%.3f").c_str(), f.connect_ms, f.transports.c_str());
    if (run_perftest && u.gbps < 0)
      std::fprintf(stderr, "ucx_perftest output:\n%s\n", u.log.c_str());
    std::fflush(stdout);
  }
  std::printf(
      "connect + authenticate: best per case above; worst of all runs %.1f ms "
      "(target < 50 ms)\n",
      worst_connect);
  return 0;
}

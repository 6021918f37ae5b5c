#include "tools/sync_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "base/clock.h"
#include "base/file_util.h"
#include "base/parse_number.h"
#include "base/status_macros.h"
#include "ferry/model.h"
#include "ferry/sync.h"
#include "ferry/vllm_slices.h"
#include "sync/copy.h"
#include "tools/child_process.h"
#include "tools/host_buffer.h"
#include "tools/ucx_perftest.h"
#include "transport/net/auth.h"

namespace ferry::tools {
namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double best_of_three(F f) {
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t = Clock::now();
    f();
    best = std::min(best, seconds_since(t));
  }
  return best;
}

}  // namespace

CopyBandwidth measure_copy_bandwidth(std::uint64_t bytes, std::uint64_t piece_bytes) {
  CopyBandwidth out;
  out.bytes = bytes;
  out.piece_bytes = piece_bytes;
  auto src = map_anonymous(bytes, false, /*prefault=*/true);
  auto dst = map_anonymous(bytes, false, /*prefault=*/true);
  if (!src.ok() || !dst.ok() || piece_bytes == 0) return out;
  std::byte* d = dst->data();
  const std::byte* s = src->data();
  const double gb = static_cast<double>(bytes) / 1e9;
  out.whole_gbps = gb / best_of_three([&] { std::memcpy(d, s, bytes); });
  out.glibc_pieces_gbps = gb / best_of_three([&] {
                            for (std::uint64_t off = 0; off < bytes; off += piece_bytes) {
                              std::memcpy(d + off, s + off, std::min(piece_bytes, bytes - off));
                            }
                          });
  out.ferry_pieces_gbps =
      gb / best_of_three([&] {
        for (std::uint64_t off = 0; off < bytes; off += piece_bytes) {
          sync::copy_bytes(d + off, s + off, std::min(piece_bytes, bytes - off));
        }
      });
  const std::uint64_t half = bytes / 2;
  out.two_threads_gbps =
      gb / best_of_three([&] {
        std::thread other([&] { std::memcpy(d + half, s + half, bytes - half); });
        std::memcpy(d, s, half);
        other.join();
      });
  return out;
}

Result<std::vector<TensorSpec>> bench_specs(const std::string& preset, DType dtype,
                                            std::uint32_t tensor_count,
                                            std::uint64_t tensor_bytes) {
  std::vector<TensorSpec> specs;
  if (tensor_count > 0) {
    const auto elems =
        static_cast<std::int64_t>(tensor_bytes * 8 / static_cast<std::uint64_t>(dtype_bits(dtype)));
    for (std::uint32_t i = 0; i < tensor_count; ++i) {
      specs.push_back(*TensorSpec::make(fmt::format("t.{}", i), dtype, {elems}));
    }
    return specs;
  }
  auto cfg = model::preset(preset);
  if (!cfg.ok()) return cfg.status();
  return model::hf_tensor_specs(*cfg, dtype);
}

Result<std::vector<BenchResult>> run_sync_bench(
    const BenchConfig& config, const CopyBandwidth& limits,
    const std::function<void(const BenchResult&)>& on_result) {
  std::vector<BenchResult> results;
  for (DType dtype : config.dtypes) {
    FERRY_ASSIGN_OR_RETURN(
        const std::vector<TensorSpec> specs,
        bench_specs(config.preset, dtype, config.tensor_count, config.tensor_bytes));
    std::uint64_t total = 0;
    for (const auto& s : specs) total += s.bytes();
    auto source = map_anonymous(total, true, /*prefault=*/true);
    if (!source.ok()) return source.status();
    const std::vector<TensorView> views = lay_out(specs, source->data());
    // Per tensor-parallel rank, its slice of each tensor (config.tp > 1).
    std::vector<std::vector<TensorSlice>> slices;
    if (config.tp > 1) {
      if (config.tensor_count != 0) {
        return invalid_argument("--tp slices the preset's tensors: give no synthetic manifest");
      }
      FERRY_ASSIGN_OR_RETURN(const model::ModelConfig cfg, model::preset(config.preset));
      for (std::uint32_t r = 0; r < config.tp; ++r) {
        FERRY_ASSIGN_OR_RETURN(auto rank, convert::vllm_tp_slices(cfg, specs, static_cast<int>(r),
                                                                  static_cast<int>(config.tp)));
        slices.push_back(std::move(rank));
      }
    }
    for (std::uint64_t bucket_mb : config.bucket_mb) {
      for (std::uint32_t n : config.receivers) {
        sync::SyncOptions o;
        o.bucket_bytes = bucket_mb << 20;
        o.slots = config.slots;
        o.checksums = config.checksums;
        const std::string address = fmt::format("@ferry-bench-{}-{}-{}", ::getpid(), bucket_mb, n);
        const int rounds = config.rounds + 1;
        // Receivers first, while this process is small; they retry until the sender listens.
        std::vector<Subprocess> kids;
        for (std::uint32_t id = 0; id < n; ++id) {
          auto kid = fork_child([&, id]() -> std::string {
            auto rx = sync::Receiver::connect(address, id, o);
            if (!rx.ok()) return "error " + rx.status().to_string();
            auto dst = map_anonymous(total, false, /*prefault=*/true);
            if (!dst.ok()) return "error " + dst.status().to_string();
            std::uint64_t off = 0;
            std::unordered_map<std::string, std::byte*> where;  // bucket_callback mode
            for (std::size_t i = 0; i < specs.size(); ++i) {
              const TensorSpec& s = specs[i];
              if (config.bucket_callback) {
                where[s.name] = dst->data() + off;
              } else if (!slices.empty()) {
                const TensorSlice& slice = slices[id % config.tp][i];
                (void)(*rx)->set_destination(slice, {dst->data() + off, slice.local.bytes()});
              } else {
                (void)(*rx)->set_destination({s, {dst->data() + off, s.bytes()}});
              }
              off += s.bytes();
            }
            std::uint64_t delivered = 0;
            const sync::BucketCallback copy_out = [&](std::span<const TensorView> weights, bool) {
              for (const TensorView& t : weights) {
                std::memcpy(where.at(t.spec.name), t.data.data(), t.data.size());
              }
              return ok_status();
            };
            for (int r = 0; r < rounds; ++r) {
              auto got = config.bucket_callback ? (*rx)->receive_round_buckets(copy_out)
                                                : (*rx)->receive_round_into();
              if (!got.ok()) return "error " + got.status().to_string();
              delivered = got->delivered_bytes;
            }
            return fmt::format("{} {}", peak_rss_bytes(), delivered);
          });
          if (!kid.ok()) return kid.status();
          kids.push_back(std::move(*kid));
        }
        auto sender = sync::Sender::create(address, o);
        if (!sender.ok()) return sender.status();
        Status s = (*sender)->accept(n);
        if (!s.ok()) return s;
        std::vector<double> times;
        for (int r = 0; r < rounds; ++r) {
          auto st = (*sender)->send_round(views);
          if (!st.ok()) return st.status();
          if (r > 0) times.push_back(st->seconds);
        }
        BenchResult res;
        for (Subprocess& k : kids) {
          auto out = finish_child(k);
          if (!out.ok()) return out.status();
          if (out->rfind("error", 0) == 0) return aborted("bench receiver: " + *out);
          const auto space = out->find(' ');
          FERRY_ASSIGN_OR_RETURN(
              const auto rss,
              parse_number_field<std::uint64_t>("bench receiver peak RSS", out->substr(0, space)));
          FERRY_ASSIGN_OR_RETURN(
              const auto delivered,
              parse_number_field<std::uint64_t>(
                  "bench receiver delivered bytes",
                  space == std::string::npos ? std::string() : out->substr(space + 1)));
          res.peak_rss_bytes = std::max(res.peak_rss_bytes, rss);
          res.delivered_bytes = std::max(res.delivered_bytes, delivered);
        }
        std::sort(times.begin(), times.end());
        res.dtype = dtype;
        res.bucket_mb = bucket_mb;
        res.receivers = n;
        res.tensors = static_cast<std::uint32_t>(specs.size());
        res.bytes = total;
        res.seconds = times[times.size() / 2];
        res.gbps = static_cast<double>(total) / res.seconds / 1e9;
        res.ratio_to_memcpy = limits.whole_gbps > 0 ? res.gbps / limits.whole_gbps : 0;
        res.aggregate_gbps = res.gbps * n;
        res.aggregate_ratio_to_two_threads =
            limits.two_threads_gbps > 0 ? res.aggregate_gbps / limits.two_threads_gbps : 0;
        res.sender_peak_rss_bytes = peak_rss_bytes();
        results.push_back(res);
        if (on_result) on_result(res);
      }
    }
  }
  return results;
}

// ---- --net ----

namespace {

sync::SyncOptions net_options(const NetBenchConfig& c, std::uint64_t bucket_mb) {
  sync::SyncOptions o;
  o.bucket_bytes = bucket_mb << 20;
  o.slots = c.slots;
  o.checksums = c.checksums;
  o.timeout = c.timeout;
  if (!c.wire_protect.empty()) o.wire_protect = c.wire_protect[0];
  return o;
}

Result<std::vector<TensorSpec>> net_specs(const NetBenchConfig& c) {
  return bench_specs(c.preset, c.dtype, c.tensor_count, c.tensor_bytes);
}

// Children write "error ..." or their figures; an error text becomes this Status.
Status child_error(const std::string& who, const std::string& out) {
  if (out.rfind("error", 0) == 0) return aborted(who + ": " + out.substr(6));
  return ok_status();
}

}  // namespace

Status ensure_bench_token() {
  if (std::getenv("FERRY_TOKEN") != nullptr || std::getenv("FERRY_TOKEN_FILE") != nullptr) {
    return ok_status();
  }
  std::array<std::uint8_t, 32> raw{};  // as `ferry token new`: 256 bits
  Status s = net::random_bytes(raw);
  if (!s.ok()) return s;
  std::string secret;
  for (std::uint8_t b : raw) secret += fmt::format("{:02x}", b);
  if (::setenv("FERRY_TOKEN", secret.c_str(), 1) != 0) {
    return errno_status("setenv", "FERRY_TOKEN", errno);
  }
  return ok_status();
}

Result<NetNodeResult> run_net_bench_node(const NetBenchConfig& config, const std::string& upstream,
                                         std::uint32_t relay_id) {
  if (config.bucket_mb.empty()) return invalid_argument("--net node: no bucket size");
  auto specs = net_specs(config);
  if (!specs.ok()) return specs.status();
  std::uint64_t total = 0;
  for (const auto& s : *specs) total += s.bytes();
  const sync::SyncOptions o = net_options(config, config.bucket_mb[0]);
  const std::string local = fmt::format("@ferry-netbench-{}-{}", ::getpid(), relay_id);
  const int rounds = config.rounds + 1;
  // Local receivers first, before this process has a UCX context; they retry until the
  // relay's local address is up.
  std::vector<Subprocess> kids;
  auto stop_kids = [&] { kids.clear(); };  // each Subprocess kills and reaps its child
  for (std::uint32_t id = 0; id < config.receivers_per_node; ++id) {
    auto kid = fork_child([&, id]() -> std::string {
      auto rx = sync::Receiver::connect(local, id, o);
      if (!rx.ok()) return "error " + rx.status().to_string();
      auto dst = map_anonymous(total, false, /*prefault=*/true);
      if (!dst.ok()) return "error " + dst.status().to_string();
      std::uint64_t off = 0;
      for (const auto& s : *specs) {
        (void)(*rx)->set_destination({s, {dst->data() + off, s.bytes()}});
        off += s.bytes();
      }
      CpuSeconds timed_from;  // after the warm-up round
      for (int r = 0; r < rounds; ++r) {
        auto got = (*rx)->receive_round_into();
        if (!got.ok()) return "error " + got.status().to_string();
        if (r == 0) timed_from = cpu_seconds();
      }
      return fmt::format("{} {}", peak_rss_bytes(), (cpu_seconds() - timed_from).total());
    });
    if (!kid.ok()) {
      stop_kids();
      return kid.status();
    }
    kids.push_back(std::move(*kid));
  }
  NetNodeResult res;
  const auto t0 = Clock::now();
  auto relay = sync::Relay::connect(upstream, relay_id, local, o);
  res.setup_ms = seconds_since(t0) * 1e3;
  if (!relay.ok()) {
    stop_kids();
    return relay.status();
  }
  Status s = (*relay)->accept(config.receivers_per_node);
  if (!s.ok()) {
    stop_kids();
    return s;
  }
  CpuSeconds timed_from;
  for (int r = 0; r < rounds; ++r) {
    auto st = (*relay)->relay_round();
    if (!st.ok()) {
      stop_kids();
      return st.status();
    }
    res.round_seconds.push_back(st->seconds);
    if (r == 0) timed_from = cpu_seconds();
  }
  const double relay_cpu = (cpu_seconds() - timed_from).total();
  double receivers_cpu = 0;
  res.relay_peak_rss_bytes = peak_rss_bytes();
  Status first = ok_status();
  for (std::size_t i = 0; i < kids.size(); ++i) {
    auto out = finish_child(kids[i]);
    Status e = out.ok() ? child_error(fmt::format("relay {} local receiver {}", relay_id, i), *out)
                        : out.status();
    if (!e.ok()) {
      if (first.ok()) first = e;
      continue;
    }
    std::istringstream in(*out);
    std::uint64_t rss = 0;
    double rx_cpu = 0;
    if (!(in >> rss >> rx_cpu)) {
      return internal_error("relay receiver's report '" + *out + "': expected peak RSS and CPU");
    }
    res.receiver_peak_rss_bytes = std::max(res.receiver_peak_rss_bytes, rss);
    receivers_cpu += rx_cpu;
  }
  if (!first.ok()) return first;
  if (config.rounds > 0) {
    res.cpu_per_round = (relay_cpu + receivers_cpu) / config.rounds;
    res.relay_cpu_per_round = relay_cpu / config.rounds;
    res.receiver_cpu_per_round =
        receivers_cpu / config.rounds / std::max<std::uint32_t>(1, config.receivers_per_node);
  }
  return res;
}

Result<NetBenchResult> run_net_bench_sender(
    const NetBenchConfig& config, const std::string& listen,
    const std::function<void(const std::string& address)>& on_listening) {
  if (config.bucket_mb.empty() || config.nodes.empty()) {
    return invalid_argument("--net sender: needs one bucket size and one node count");
  }
  auto specs = net_specs(config);
  if (!specs.ok()) return specs.status();
  std::uint64_t total = 0;
  for (const auto& s : *specs) total += s.bytes();
  auto source = map_anonymous(total, true, /*prefault=*/true);
  if (!source.ok()) return source.status();
  const std::vector<TensorView> views = lay_out(*specs, source->data());
  auto sender = sync::Sender::create(listen, net_options(config, config.bucket_mb[0]));
  if (!sender.ok()) return sender.status();
  if (on_listening) on_listening((*sender)->address());
  Status s = (*sender)->accept(config.nodes[0]);
  if (!s.ok()) return s;
  std::vector<double> times;
  CpuSeconds timed_from;
  for (int r = 0; r < config.rounds + 1; ++r) {
    auto st = (*sender)->send_round(views);
    if (!st.ok()) return st.status();
    if (r > 0) times.push_back(st->seconds);  // round 0 warms up
    if (r == 0) timed_from = cpu_seconds();
  }
  const CpuSeconds cpu = cpu_seconds() - timed_from;
  NetBenchResult res;
  if (config.rounds > 0) {
    res.sender_cpu_user_per_round = cpu.user / config.rounds;
    res.sender_cpu_sys_per_round = cpu.sys / config.rounds;
  }
  res.dtype = config.dtype;
  res.bucket_mb = config.bucket_mb[0];
  res.nodes = config.nodes[0];
  res.wire_protect = net_options(config, config.bucket_mb[0]).wire_protect;
  res.tensors = static_cast<std::uint32_t>(specs->size());
  res.bytes = total;
  res.seconds = median(times);
  res.gbps_per_node = res.seconds > 0 ? static_cast<double>(total) / res.seconds / 1e9 : 0;
  return res;
}

Result<std::vector<NetBenchResult>> run_net_sync_bench(
    const NetBenchConfig& config, const std::function<void(const NetBenchResult&)>& on_result) {
  Status tok = ensure_bench_token();
  if (!tok.ok()) return tok;
  auto specs = net_specs(config);
  if (!specs.ok()) return specs.status();
  std::uint64_t total = 0;
  for (const auto& s : *specs) total += s.bytes();
  std::vector<NetBenchResult> results;
  for (std::uint64_t bucket_mb : config.bucket_mb) {
    // U first, while no node runs: about one model's worth of messages at the bucket size.
    const std::uint64_t bucket = bucket_mb << 20;
    const std::uint64_t messages = std::max<std::uint64_t>(4, (total + bucket - 1) / bucket);
    const PerftestResult u = ucx_perftest_loopback(bucket, messages);
    if (u.gbps <= 0) {
      // Straight to stderr, not base/log: the tools sit outside libferry and its logger.
      fmt::print(stderr, "ferry bench: warning: ucx_perftest at {} MiB gave no figure: {}\n",
                 bucket_mb, u.log);
    }
    std::vector<WireProtect> modes = config.wire_protect;
    std::sort(modes.begin(), modes.end());
    modes.erase(std::unique(modes.begin(), modes.end()), modes.end());
    if (modes.empty()) modes.push_back(sync::SyncOptions{}.wire_protect);
    std::map<WireProtect, double> one_node_seconds;
    for (std::uint32_t n : config.nodes) {
      double none_gbps = 0;
      for (WireProtect mode : modes) {
        NetBenchConfig c = config;
        c.bucket_mb = {bucket_mb};
        c.nodes = {n};
        c.wire_protect = {mode};
        // Each node waits for the sender's address on a pipe, so its Relay::connect time is
        // connect + authenticate + join, not time spent waiting for the sender to exist.
        std::vector<int> write_ends;
        std::vector<int> read_ends;
        for (std::uint32_t i = 0; i < n; ++i) {
          int p[2];
          if (::pipe2(p, O_CLOEXEC) != 0) return errno_status("pipe2", "bench node address", errno);
          read_ends.push_back(p[0]);
          write_ends.push_back(p[1]);
        }
        std::vector<Subprocess> kids;
        for (std::uint32_t i = 0; i < n; ++i) {
          auto kid = fork_child([&, i]() -> std::string {
            for (int fd : write_ends) ::close(fd);
            std::string upstream;
            char ch = 0;
            while (::read(read_ends[i], &ch, 1) == 1 && ch != '\n') upstream += ch;
            if (upstream.empty()) return "error the bench sender never started";
            auto r = run_net_bench_node(c, upstream, i + 1);
            if (!r.ok()) return "error " + r.status().to_string();
            return fmt::format("{} {} {} {} {} {}", r->setup_ms, r->relay_peak_rss_bytes,
                               r->receiver_peak_rss_bytes, r->cpu_per_round, r->relay_cpu_per_round,
                               r->receiver_cpu_per_round);
          });
          if (!kid.ok()) return kid.status();
          kids.push_back(std::move(*kid));
        }
        for (int fd : read_ends) ::close(fd);
        auto close_writers = [&] {
          for (int& fd : write_ends) {
            if (fd >= 0) ::close(fd);
            fd = -1;
          }
        };
        auto res = run_net_bench_sender(c, fmt::format("{}:0", config.host),
                                        [&](const std::string& address) {
                                          const std::string line = address + "\n";
                                          for (int fd : write_ends) {
                                            (void)write_all(fd, as_bytes(line), "bench node pipe");
                                          }
                                          close_writers();
                                        });
        close_writers();
        // Every node's outcome, even when the sender failed: its error often names the cause.
        Status node_error = ok_status();
        std::vector<double> setup;
        NetBenchResult r = res.ok() ? *res : NetBenchResult{};
        for (std::uint32_t i = 0; i < n; ++i) {
          if (!res.ok()) kids[i].kill();
          auto out = finish_child(kids[i]);
          Status e = out.ok() ? child_error(fmt::format("bench node (relay {})", i + 1), *out)
                              : out.status();
          if (!e.ok()) {
            if (node_error.ok()) node_error = e;
            continue;
          }
          if (!res.ok()) continue;
          std::istringstream in(*out);
          double ms = 0;
          std::uint64_t relay_rss = 0;
          std::uint64_t rx_rss = 0;
          double node_cpu = 0;
          double relay_cpu = 0;
          double rx_cpu = 0;
          in >> ms >> relay_rss >> rx_rss >> node_cpu >> relay_cpu >> rx_cpu;
          setup.push_back(ms);
          r.node_cpu_per_round += node_cpu / n;
          r.relay_cpu_per_gb += relay_cpu / n / (r.bytes / 1e9);
          r.receiver_cpu_per_gb += rx_cpu / n / (r.bytes / 1e9);
          r.relay_peak_rss_bytes = std::max(r.relay_peak_rss_bytes, relay_rss);
          r.receiver_peak_rss_bytes = std::max(r.receiver_peak_rss_bytes, rx_rss);
        }
        if (!res.ok()) return res.status();
        if (!node_error.ok()) return node_error;
        r.perftest_gbps = u.gbps;
        r.perftest_mode = u.mode;
        // Per GB the sender sent: each node gets the whole round.
        r.sender_cpu_per_gb =
            (r.sender_cpu_user_per_round + r.sender_cpu_sys_per_round) / (r.bytes * n / 1e9);
        const double u_gb = static_cast<double>(bucket) * (messages + kPerftestWarmup) / 1e9;
        r.perftest_send_cpu_per_gb = u.send_cpu_seconds / u_gb;
        r.perftest_recv_cpu_per_gb = u.recv_cpu_seconds / u_gb;
        r.ratio_to_perftest = u.gbps > 0 ? r.gbps_per_node / u.gbps : 0;
        if (n == 1) one_node_seconds[mode] = r.seconds;
        r.round_time_ratio_to_one_node =
            one_node_seconds[mode] > 0 ? r.seconds / one_node_seconds[mode] : 0;
        if (mode == WireProtect::kNone) none_gbps = r.gbps_per_node;
        r.ratio_to_none = none_gbps > 0 ? r.gbps_per_node / none_gbps : 0;
        r.setup_ms_min = *std::min_element(setup.begin(), setup.end());
        r.setup_ms_max = *std::max_element(setup.begin(), setup.end());
        results.push_back(r);
        if (on_result) on_result(r);
      }
    }
  }
  return results;
}

}  // namespace ferry::tools

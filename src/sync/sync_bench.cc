#include "sync/sync_bench.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/file_util.h"
#include "ferry/model.h"
#include "ferry/sync.h"
#include "sync/child_process.h"
#include "sync/copy.h"
#include "sync/host_buffer.h"

namespace ferry::sync {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
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
  out.ferry_pieces_gbps = gb / best_of_three([&] {
                            for (std::uint64_t off = 0; off < bytes; off += piece_bytes) {
                              copy_bytes(d + off, s + off, std::min(piece_bytes, bytes - off));
                            }
                          });
  const std::uint64_t half = bytes / 2;
  out.two_threads_gbps = gb / best_of_three([&] {
                           std::thread other([&] { std::memcpy(d + half, s + half, bytes - half); });
                           std::memcpy(d, s, half);
                           other.join();
                         });
  return out;
}

Result<std::vector<BenchResult>> run_sync_bench(
    const BenchConfig& config, const CopyBandwidth& limits,
    const std::function<void(const BenchResult&)>& on_result) {
  std::vector<BenchResult> results;
  for (DType dtype : config.dtypes) {
    std::vector<TensorSpec> specs;
    if (config.tensor_count > 0) {
      const auto elems = static_cast<std::int64_t>(config.tensor_bytes * 8 /
                                                   static_cast<std::uint64_t>(dtype_bits(dtype)));
      for (std::uint32_t i = 0; i < config.tensor_count; ++i) {
        specs.push_back(*TensorSpec::make(fmt::format("t.{}", i), dtype, {elems}));
      }
    } else {
      auto cfg = model::preset(config.preset);
      if (!cfg.ok()) return cfg.status();
      specs = model::hf_tensor_specs(*cfg, dtype);
    }
    std::uint64_t total = 0;
    for (const auto& s : specs) total += s.bytes();
    auto source = map_anonymous(total, true, /*prefault=*/true);
    if (!source.ok()) return source.status();
    const std::vector<TensorView> views = lay_out(specs, source->data());
    for (std::uint64_t bucket_mb : config.bucket_mb) {
      for (std::uint32_t n : config.receivers) {
        SyncOptions o;
        o.bucket_bytes = bucket_mb << 20;
        o.slots = config.slots;
        o.checksums = config.checksums;
        const std::string address = fmt::format("@ferry-bench-{}-{}-{}", ::getpid(), bucket_mb, n);
        const int rounds = config.rounds + 1;
        // Receivers first, while this process is small; they retry until the sender listens.
        std::vector<Child> kids;
        for (std::uint32_t id = 0; id < n; ++id) {
          auto kid = fork_child([&, id]() -> std::string {
            auto rx = Receiver::connect(address, id, o);
            if (!rx.ok()) return "error " + rx.status().to_string();
            auto dst = map_anonymous(total, false, /*prefault=*/true);
            if (!dst.ok()) return "error " + dst.status().to_string();
            std::uint64_t off = 0;
            for (const auto& s : specs) {
              (void)(*rx)->set_destination({s, {dst->data() + off, s.bytes()}});
              off += s.bytes();
            }
            for (int r = 0; r < rounds; ++r) {
              auto got = (*rx)->receive_round_into();
              if (!got.ok()) return "error " + got.status().to_string();
            }
            return fmt::format("{}", peak_rss_bytes());
          });
          if (!kid.ok()) return kid.status();
          kids.push_back(*kid);
        }
        auto sender = Sender::create(address, o);
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
        for (Child& k : kids) {
          auto out = finish_child(k);
          if (!out.ok()) return out.status();
          if (out->rfind("error", 0) == 0) return aborted("bench receiver: " + *out);
          res.peak_rss_bytes = std::max<std::uint64_t>(res.peak_rss_bytes, std::stoull(*out));
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

}  // namespace ferry::sync

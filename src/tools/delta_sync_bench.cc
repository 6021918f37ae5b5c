#include "tools/delta_sync_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "base/file_util.h"
#include "base/status_macros.h"
#include "delta/training_update.h"
#include "ferry/model.h"
#include "ferry/sync.h"
#include "tools/child_process.h"
#include "tools/host_buffer.h"

namespace ferry::tools {
namespace {

// This process's resident set now (VmRSS), in bytes.
std::uint64_t current_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      std::uint64_t kb = 0;
      status >> kb;
      return kb << 10;
    }
  }
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A receiver process in destination mode on `address`, receiving `rounds` rounds.
Result<Subprocess> start_receiver(const std::string& address, const sync::SyncOptions& o,
                                  const std::vector<TensorSpec>& specs, std::uint64_t total,
                                  int rounds) {
  return fork_child([address, o, specs, total, rounds]() -> std::string {
    auto dst = map_anonymous(total, false, /*prefault=*/true);
    if (!dst.ok()) return "error " + dst.status().to_string();
    auto rx = sync::Receiver::connect(address, 0, o);
    if (!rx.ok()) return "error " + rx.status().to_string();
    std::uint64_t off = 0;
    for (const auto& s : specs) {
      (void)(*rx)->set_destination({s, {dst->data() + off, s.bytes()}});
      off += s.bytes();
    }
    for (int r = 0; r < rounds; ++r) {
      auto got = (*rx)->receive_round_into();
      if (!got.ok()) return "error " + got.status().to_string();
    }
    // Stay until the sender ends the session: a receiver that exits right after its last
    // ACK can be seen to close before the ACK is read.
    (void)(*rx)->receive_round_into();
    return "ok";
  });
}

}  // namespace

Result<std::vector<DeltaBenchResult>> run_delta_sync_bench(
    const DeltaBenchConfig& config, const std::function<void(const DeltaBenchResult&)>& on_result) {
  if (config.rounds < 1) return invalid_argument("--rounds must be 1 or more");
  for (double d : config.densities) {
    if (!(d >= 0 && d <= 1)) {
      return invalid_argument(fmt::format("--delta-density {}: give fractions in [0, 1]", d));
    }
  }
  std::vector<TensorSpec> specs;
  if (config.tensor_count > 0) {
    const auto elems = static_cast<std::int64_t>(
        config.tensor_bytes * 8 / static_cast<std::uint64_t>(dtype_bits(config.dtype)));
    for (std::uint32_t i = 0; i < config.tensor_count; ++i) {
      specs.push_back(*TensorSpec::make(fmt::format("t.{}", i), config.dtype, {elems}));
    }
  } else {
    auto cfg = model::preset(config.preset);
    if (!cfg.ok()) return cfg.status();
    specs = model::hf_tensor_specs(*cfg, config.dtype);
  }
  std::uint64_t total = 0;
  for (const auto& s : specs) total += s.bytes();

  sync::SyncOptions dense_options;
  dense_options.bucket_bytes = config.bucket_mb << 20;
  dense_options.slots = config.slots;
  sync::SyncOptions delta_options = dense_options;
  delta_options.delta = sync::DeltaMode::kAuto;
  const std::string dense_address = fmt::format("@ferry-bench-dense-{}", ::getpid());
  const std::string delta_address = fmt::format("@ferry-bench-delta-{}", ::getpid());
  const bool adam = config.adam && config.dtype == DType::kBF16;
  // The base, each density's rounds, and Adam's two (the weights before it, the step).
  const int rounds = 1 + static_cast<int>(config.densities.size()) * config.rounds + (adam ? 2 : 0);
  // Receivers first, while this process is small.
  auto dense_rx = start_receiver(dense_address, dense_options, specs, total, rounds);
  if (!dense_rx.ok()) return dense_rx.status();
  auto delta_rx = start_receiver(delta_address, delta_options, specs, total, rounds);
  if (!delta_rx.ok()) return delta_rx.status();

  auto source = map_anonymous(total, true, /*prefault=*/true);
  if (!source.ok()) return source.status();
  const std::vector<TensorView> views = lay_out(specs, source->data());
  auto tensor_bytes = [&](std::size_t t) {
    return std::span<std::byte>(source->data() + (views[t].data.data() - source->data()),
                                views[t].data.size());
  };
  for (std::size_t t = 0; t < specs.size(); ++t) {
    model::fill_synthetic(1, specs[t].name, 0, tensor_bytes(t));
  }
  auto dense = sync::Sender::create(dense_address, dense_options);
  if (!dense.ok()) return dense.status();
  FERRY_RETURN_IF_ERROR((*dense)->accept(1));
  auto delta = sync::Sender::create(delta_address, delta_options);
  if (!delta.ok()) return delta.status();
  FERRY_RETURN_IF_ERROR((*delta)->accept(1));
  const std::uint64_t rss_before = current_rss_bytes();  // after both rings

  // Sends the source on both sessions; the round stats of each.
  auto send_both = [&]() -> Result<std::pair<sync::RoundStats, sync::RoundStats>> {
    FERRY_ASSIGN_OR_RETURN(sync::RoundStats d, (*dense)->send_round(views));
    FERRY_ASSIGN_OR_RETURN(sync::RoundStats x, (*delta)->send_round(views));
    return std::make_pair(d, x);
  };
  FERRY_RETURN_IF_ERROR(send_both().status());  // round 1: dense on both, the base
  FERRY_RETURN_IF_ERROR(send_both().status());  // round 2: a delta of nothing, every buffer made
  const std::uint64_t extra = current_rss_bytes() - rss_before;

  std::vector<DeltaBenchResult> results;
  // A failed round: the receivers' own words say why (they exit on the error).
  auto with_receivers = [&](Status why) -> Status {
    dense->reset();
    delta->reset();
    std::string said;
    for (Subprocess* k : {&*dense_rx, &*delta_rx}) {
      auto out = finish_child(*k);
      said += "; receiver: " + (out.ok() ? *out : out.status().to_string());
    }
    return Status(why.code(), why.message() + said);
  };
  auto measure = [&](const std::string& update, double density, int times,
                     const std::function<void()>& change) -> Status {
    std::vector<double> dense_times, delta_times;
    std::vector<sync::RoundStats> delta_stats;
    for (int r = 0; r < times; ++r) {
      change();
      FERRY_ASSIGN_OR_RETURN(auto both, send_both());
      dense_times.push_back(both.first.seconds);
      delta_times.push_back(both.second.seconds);
      delta_stats.push_back(both.second);
    }
    DeltaBenchResult res;
    res.update = update;
    res.density = density;
    res.bytes = total;
    res.dense_seconds = median(dense_times);
    res.delta_seconds = median(delta_times);
    res.speedup = res.delta_seconds > 0 ? res.dense_seconds / res.delta_seconds : 0;
    std::sort(delta_stats.begin(), delta_stats.end(),
              [](const auto& a, const auto& b) { return a.seconds < b.seconds; });
    const sync::RoundStats& mid = delta_stats[delta_stats.size() / 2];
    res.went_delta = mid.delta;
    res.wire_bytes = mid.wire_bytes;
    res.wire_ratio = mid.wire_bytes > 0 ? static_cast<double>(total) / mid.wire_bytes : 0;
    res.sender_extra_bytes = extra;
    results.push_back(res);
    if (on_result) on_result(res);
    return ok_status();
  };
  std::uint64_t seed = 100;
  for (double d : config.densities) {
    Status measured = measure(fmt::format("density {}", d), d, config.rounds, [&] {
      for (std::size_t t = 0; t < specs.size(); ++t) {
        const int bits = dtype_bits(specs[t].dtype);
        delta::change_elements(++seed, d, static_cast<std::size_t>(std::max(bits / 8, 1)),
                               tensor_bytes(t));
      }
    });
    if (!measured.ok()) return with_receivers(measured);
  }
  if (adam) {
    // One Adam step: publish the weights before it (untimed), then time the step itself.
    constexpr double kLr = 1e-6;
    auto after = map_anonymous(total, true, /*prefault=*/true);
    if (!after.ok()) return after.status();
    double changed = 0;
    for (std::size_t t = 0; t < specs.size(); ++t) {
      const std::span<std::byte> now = tensor_bytes(t);
      const std::span<std::byte> next(after->data() + (now.data() - source->data()), now.size());
      changed += delta::adam_step_bf16(++seed, kLr, now, next) * static_cast<double>(now.size());
    }
    Status measured = send_both().status();
    // One step, once: a second round would resend it unchanged.
    if (measured.ok()) {
      measured = measure(fmt::format("adam lr {}", kLr), changed / static_cast<double>(total), 1,
                         [&] { std::memcpy(source->data(), after->data(), total); });
    }
    if (!measured.ok()) return with_receivers(measured);
  }
  dense->reset();  // the receivers see their sessions end
  delta->reset();
  for (Subprocess* k : {&*dense_rx, &*delta_rx}) {
    FERRY_ASSIGN_OR_RETURN(std::string out, finish_child(*k));
    if (out.rfind("ok", 0) != 0) return aborted("bench receiver: " + out);
  }
  return results;
}

}  // namespace ferry::tools

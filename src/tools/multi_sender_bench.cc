#include "tools/multi_sender_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <thread>

#include "base/clock.h"
#include "ferry/multi_receiver.h"
#include "ferry/sender_parts.h"
#include "ferry/sync.h"
#include "tools/host_buffer.h"
#include "tools/sync_bench.h"

namespace ferry::tools {
namespace {

// One sender count: S senders on threads, the MultiReceiver on this one.
Result<MultiSenderBenchResult> run_one(const MultiSenderBenchConfig& config,
                                       const std::vector<TensorSpec>& specs,
                                       const std::vector<TensorView>& source,
                                       std::span<std::byte> destination, std::uint32_t senders) {
  auto parts = sync::split_into_parts(specs, senders);
  if (!parts.ok()) return parts.status();
  sync::SyncOptions o;
  o.bucket_bytes = config.bucket_mb << 20;
  o.slots = config.slots;
  o.checksums = config.checksums;
  const int rounds = config.rounds + 1;
  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<sync::Sender>> ends;
  for (std::uint32_t k = 0; k < senders; ++k) {
    addresses.push_back(fmt::format("@ferry-bench-senders-{}-{}-{}", ::getpid(), senders, k));
    auto s = sync::Sender::create(addresses.back(), o);
    if (!s.ok()) return s.status();
    ends.push_back(std::move(*s));
  }
  std::vector<Status> sent(senders);
  std::vector<std::thread> threads;
  for (std::uint32_t k = 0; k < senders; ++k) {
    threads.emplace_back([&, k] {
      std::vector<TensorView> views;
      for (std::size_t i : (*parts)[k]) views.push_back(source[i]);
      sent[k] = ends[k]->accept(1);
      for (int r = 0; r < rounds && sent[k].ok(); ++r) {
        sent[k] = ends[k]->send_round(views).status();
      }
    });
  }
  auto received = [&]() -> Result<MultiSenderBenchResult> {
    auto rx = sync::MultiReceiver::connect(addresses, 0, o);
    if (!rx.ok()) return rx.status();
    std::uint64_t offset = 0;
    for (const TensorSpec& s : specs) {
      Status st = (*rx)->set_destination({s, destination.subspan(offset, s.bytes())});
      if (!st.ok()) return st;
      offset += s.bytes();
    }
    MultiSenderBenchResult res;
    res.senders = senders;
    Clock::time_point timed_from;
    for (int r = 0; r < rounds; ++r) {
      if (r == 1) timed_from = Clock::now();  // after the warm-up round
      auto got = (*rx)->receive_round_into();
      if (!got.ok()) return got.status();
      res.tensors = got->tensors;
      res.bytes = got->bytes;
    }
    res.seconds = std::chrono::duration<double>(Clock::now() - timed_from).count() / config.rounds;
    res.gbps = res.seconds > 0 ? res.bytes / 1e9 / res.seconds : 0;
    return res;
  }();
  // A failed receiver closes its sessions, so every sender's thread ends.
  for (std::thread& t : threads) t.join();
  if (!received.ok()) return received.status();
  for (std::uint32_t k = 0; k < senders; ++k) {
    if (!sent[k].ok()) return sent[k].with_context(fmt::format("bench sender {}", k));
  }
  return received;
}

}  // namespace

Result<std::vector<MultiSenderBenchResult>> run_multi_sender_bench(
    const MultiSenderBenchConfig& config,
    const std::function<void(const MultiSenderBenchResult&)>& on_result) {
  if (config.rounds < 1) return invalid_argument("--rounds: give 1 or more");
  auto specs = bench_specs(config.preset, config.dtype, config.tensor_count, config.tensor_bytes);
  if (!specs.ok()) return specs.status();
  std::uint64_t total = 0;
  for (const TensorSpec& s : *specs) total += s.bytes();
  auto source = map_anonymous(total, false, /*prefault=*/true);
  if (!source.ok()) return source.status();
  std::memset(source->data(), 0x3c, total);
  auto destination = map_anonymous(total, false, /*prefault=*/true);
  if (!destination.ok()) return destination.status();
  const std::vector<TensorView> views = lay_out(*specs, source->data());
  std::vector<MultiSenderBenchResult> results;
  double one_sender_gbps = 0;
  for (std::uint32_t senders : config.senders) {
    if (senders == 0) return invalid_argument("--senders: give 1 or more");
    auto r = run_one(config, *specs, views, {destination->data(), total}, senders);
    if (!r.ok()) return r.status();
    if (senders == 1) one_sender_gbps = r->gbps;
    r->ratio_to_one_sender = one_sender_gbps > 0 ? r->gbps / one_sender_gbps : 0;
    on_result(*r);
    results.push_back(*r);
  }
  return results;
}

}  // namespace ferry::tools

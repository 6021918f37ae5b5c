#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <type_traits>
#include <unordered_set>

#include "base/clock.h"
#include "base/log.h"
#include "base/random.h"
#include "base/status_macros.h"
#include "ferry/sync.h"
#include "profiler/span.h"
#include "sync/bucket_planner.h"
#include "sync/copy.h"
#include "sync/delta_sender.h"
#include "sync/fanout.h"
#include "sync/round_checksum.h"
#include "sync/round_stats.h"
#include "sync/segment.h"
#include "sync/sync_options.h"
#include "sync/testing.h"
#include "wire/conversation.h"
#include "wire/message.h"

namespace ferry::sync {
namespace {

testing::CorruptSlot& corrupt_slot_hook() {
  static testing::CorruptSlot hook;
  return hook;
}

std::uint64_t random_session() {
  std::uint64_t v = 0;
  while (v == 0) v = random_u64();
  return v;
}

// The caller's tensors as send_round reads them: for_each_run(i, offset, n, f) calls
// f(pointer, length) for the contiguous runs holding bytes [offset, offset + n) of tensor i.
struct ViewSource {
  std::span<const TensorView> views;
  std::size_t size() const { return views.size(); }
  const TensorSpec& spec(std::size_t i) const { return views[i].spec; }
  std::uint64_t bytes_given(std::size_t i) const { return views[i].data.size(); }
  template <class F>
  void for_each_run(std::size_t i, std::uint64_t offset, std::uint64_t n, F&& f) const {
    f(views[i].data.data() + offset, n);
  }
};

struct GatheredSource {
  std::span<const GatheredTensor> tensors;
  std::vector<std::vector<std::uint64_t>> starts;  // starts[i][j]: offset of parts[j] in tensor i

  explicit GatheredSource(std::span<const GatheredTensor> t) : tensors(t) {
    starts.reserve(t.size());
    for (const GatheredTensor& g : t) {
      std::vector<std::uint64_t> at;
      at.reserve(g.parts.size() + 1);
      std::uint64_t sum = 0;
      for (const auto& part : g.parts) {
        at.push_back(sum);
        sum += part.size();
      }
      at.push_back(sum);
      starts.push_back(std::move(at));
    }
  }
  std::size_t size() const { return tensors.size(); }
  const TensorSpec& spec(std::size_t i) const { return tensors[i].spec; }
  std::uint64_t bytes_given(std::size_t i) const { return starts[i].back(); }
  template <class F>
  void for_each_run(std::size_t i, std::uint64_t offset, std::uint64_t n, F&& f) const {
    const std::vector<std::uint64_t>& at = starts[i];
    // The last part that starts at or before `offset`.
    std::size_t j =
        static_cast<std::size_t>(std::upper_bound(at.begin(), at.end() - 1, offset) - at.begin()) -
        1;
    while (n > 0) {
      const auto& part = tensors[i].parts[j];
      const std::uint64_t in_part = offset - at[j];
      const std::uint64_t len = std::min<std::uint64_t>(n, part.size() - in_part);
      if (len > 0) f(part.data() + in_part, len);
      offset += len;
      n -= len;
      ++j;
    }
  }
};

// Tensors pulled from a TensorStream as the packer reaches them, in manifest order (the
// plan lays tensors out in that order). The first error is kept: nothing more is pulled or
// copied, and send_round aborts the round with it after the segment.
struct StreamSource {
  std::span<const TensorSpec> specs;
  const TensorStream* next;
  mutable std::size_t pulled = 0;  // tensors [0, pulled) were asked for
  mutable std::span<const std::byte> current;
  mutable Status error;

  std::size_t size() const { return specs.size(); }
  const TensorSpec& spec(std::size_t i) const { return specs[i]; }
  std::uint64_t bytes_given(std::size_t i) const { return specs[i].bytes(); }
  template <class F>
  void for_each_run(std::size_t i, std::uint64_t offset, std::uint64_t n, F&& f) const {
    if (pull_through(i)) f(current.data() + offset, n);
  }
  // Pulls up to tensor i (empty tensors have no bytes to pack, but are pulled all the same).
  bool pull_through(std::size_t i) const {
    while (error.ok() && pulled <= i) {
      const TensorSpec& want = specs[pulled];
      Result<std::span<const std::byte>> bytes = (*next)(pulled);
      if (!bytes.ok()) {
        error = Status(bytes.status().code(), fmt::format("tensor {} '{}': {}", pulled, want.name,
                                                          bytes.status().message()));
      } else if (bytes->size() != want.bytes()) {
        error =
            invalid_argument(fmt::format("tensor {} '{}': {} bytes given, {} needs {}", pulled,
                                         want.name, bytes->size(), want.to_string(), want.bytes()));
      } else {
        current = *bytes;
        ++pulled;
      }
    }
    return error.ok();
  }
  // After the last bucket: every tensor was pulled and the stream has no more.
  Status finish() const {
    if (!specs.empty()) pull_through(specs.size() - 1);
    if (!error.ok()) return error;
    Result<std::span<const std::byte>> rest = (*next)(specs.size());
    if (!rest.ok()) return rest.status();
    if (!rest->empty()) {
      return invalid_argument(
          fmt::format("the stream has more than the {} tensors of the round", specs.size()));
    }
    return ok_status();
  }
};

// The producer writes into the slot itself (send_round_filled). Its copies may still be
// in flight when fill returns, so the segment is hashed from the slot after flush, not
// while it is copied.
struct FillSource {
  std::span<const TensorSpec> specs;
  const TensorFill* fill;
  const FillFlush* flush;

  std::size_t size() const { return specs.size(); }
  const TensorSpec& spec(std::size_t i) const { return specs[i]; }
  std::uint64_t bytes_given(std::size_t i) const { return specs[i].bytes(); }

  // Fills slot bytes [begin, end) and waits for the copies: nothing is read before that.
  Status fill_segment(std::byte* slot, SegmentWalker& walker, std::uint64_t begin,
                      std::uint64_t end, bool last) const {
    Status error;
    std::size_t first_tensor = specs.size();
    std::size_t last_tensor = 0;
    walker.walk(
        begin, end, last,
        [&](const Piece& p, std::uint64_t at, std::uint64_t n) {
          if (!error.ok() || n == 0) return;
          first_tensor = std::min<std::size_t>(first_tensor, p.tensor);
          last_tensor = p.tensor;
          Status s = (*fill)(p.tensor, p.tensor_offset + at,
                             std::span<std::byte>(slot + p.bucket_offset + at, n));
          if (!s.ok()) {
            error = Status(s.code(), fmt::format("tensor {} '{}': {}", p.tensor,
                                                 specs[p.tensor].name, s.message()));
          }
        },
        [](const Piece&) {});
    if (!error.ok()) return error;
    Status s = (*flush)();
    if (s.ok()) return s;
    if (first_tensor == specs.size()) return s;
    return Status(s.code(), fmt::format("flushing tensors {} '{}' to {} '{}': {}", first_tensor,
                                        specs[first_tensor].name, last_tensor,
                                        specs[last_tensor].name, s.message()));
  }
};

}  // namespace

struct Sender::Impl {
  SyncOptions options;
  std::unique_ptr<Fanout> fanout;
  std::uint64_t round = 0;
  Status broken;  // the first error; the session is unusable after it
  std::vector<TensorSpec> manifest;
  BucketPlan plan;
  std::unique_ptr<DeltaSender> delta;  // set when options.delta is not kOff

  wire::Message message(wire::Body body) const { return fanout->message(std::move(body)); }

  // A round may start: the session is intact and has a receiver.
  Status ready() const {
    if (!broken.ok()) {
      return failed_precondition(
          "the session failed earlier (accept() receivers again to start a new one): " +
          broken.to_string());
    }
    if (fanout->peers().empty()) return failed_precondition("send_round: no receiver has joined");
    return ok_status();
  }

  Status fail(Status why) {
    if (broken.ok()) broken = why;
    return fanout->fail(why);
  }

  // Packs bucket b into its slot and publishes it segment by segment (sync/segment.h).
  template <class Source>
  Status send_bucket(std::uint32_t b, const Source& weights, RoundChecksum& round_sum) {
    const std::uint32_t slot_index = b % fanout->ring().slots();
    std::byte* slot = fanout->ring().slot(slot_index);
    const std::uint64_t used = plan.bucket_used[b];
    SegmentWalker walker(plan.bucket(b));
    std::uint64_t begin = 0;
    while (true) {
      const std::uint64_t end = std::min(used, begin + kSegmentBytes);
      const bool last = end == used;
      std::uint64_t sum = 0;
      if constexpr (std::is_same_v<Source, FillSource>) {
        profiler::Span span("sync.fill", profiler::Detail::kBucket);
        Status s = weights.fill_segment(slot, walker, begin, end, last);
        if (!s.ok()) return s;  // nothing of this segment is published
        if (options.checksums) sum = BucketHash(slot, begin).finish(end);
      } else {
        profiler::Span span("sync.pack", profiler::Detail::kBucket);
        BucketHash hash(slot, begin);
        walker.walk(
            begin, end, last,
            [&](const Piece& p, std::uint64_t at, std::uint64_t n) {
              std::uint64_t bucket_offset = p.bucket_offset + at;
              weights.for_each_run(
                  p.tensor, p.tensor_offset + at, n, [&](const std::byte* src, std::uint64_t len) {
                    if (options.checksums) {
                      hash.copy_piece(slot + bucket_offset, src, len, bucket_offset);
                    } else {
                      copy_bytes(slot + bucket_offset, src, len);
                    }
                    bucket_offset += len;
                  });
            },
            [](const Piece&) {});
        if (options.checksums) sum = hash.finish(end);
      }
      if constexpr (std::is_same_v<Source, StreamSource>) {
        if (!weights.error.ok()) return weights.error;  // nothing of this segment is published
      }
      round_sum.add_bucket(b, end, sum);
      if (corrupt_slot_hook() && begin == 0) corrupt_slot_hook()(b, slot);
      profiler::Span span("sync.publish", profiler::Detail::kBucket);
      Status s = fanout->send_all(
          message(wire::Filled{slot_index, b, end, sum, begin, static_cast<std::uint8_t>(last)}));
      if (!s.ok() || last) return s;
      begin = end;
    }
  }

  // `fields` carries BEGIN's delta fields (all but the version, which is the round).
  template <class Source>
  Result<RoundStats> send_round(const Source& weights, const RoundOptions& round_options,
                                wire::Begin fields = {}) {
    profiler::Span round_span("sync.send_round");
    const auto start = Clock::now();
    std::vector<TensorSpec> specs;
    specs.reserve(weights.size());
    std::unordered_set<std::string_view> names;
    names.reserve(weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const TensorSpec& spec = weights.spec(i);
      if (weights.bytes_given(i) != spec.bytes()) {
        return invalid_argument(fmt::format("tensor '{}': {} bytes given, {} needs {}", spec.name,
                                            weights.bytes_given(i), spec.to_string(),
                                            spec.bytes()));
      }
      if (!names.insert(spec.name).second) {
        return invalid_argument(fmt::format("tensor '{}' appears twice in the round", spec.name));
      }
      specs.push_back(spec);
    }
    // The plan is deterministic from the manifest: reuse it while the manifest is unchanged.
    if (specs != manifest || plan.bucket_bytes == 0) {
      auto p = plan_buckets(specs, options.bucket_bytes);
      if (!p.ok()) return p.status();
      plan = std::move(*p);
      manifest = specs;
    }
    ++round;
    fanout->set_round(round);
    for (Peer& p : fanout->peers()) {
      p.released = 0;
      p.acked = false;
    }
    wire::Begin begin = std::move(fields);
    begin.bucket_bytes = options.bucket_bytes;
    begin.total_bytes = plan.total_bytes;
    begin.bucket_count = plan.bucket_count();
    begin.more_follows = static_cast<std::uint8_t>(round_options.more_follows);
    begin.manifest = std::move(specs);
    begin.version = round;
    RoundStats stats;
    stats.delta = begin.delta != 0;
    stats.base_version = begin.base_version;
    stats.version = round;
    const wire::Message begin_message = message(std::move(begin));
    const std::vector<std::byte> begin_bytes = wire::encode(begin_message);
    RoundChecksum round_sum(begin_bytes);
    {
      Status s = fanout->send_all_bytes(begin_bytes, begin_message);
      if (!s.ok()) return fail(s);
    }
    const std::uint32_t k = fanout->ring().slots();
    for (std::uint32_t b = 0; b < plan.bucket_count(); ++b) {
      if (b >= k) {
        // Slot b % k still holds bucket b - k until every receiver released it.
        const std::uint32_t need = b - k + 1;
        profiler::Span span("sync.wait_slot", profiler::Detail::kBucket);
        Status s =
            fanout->wait_until([&](const Peer& p) { return p.released >= need; }, 0, "a free slot");
        if (!s.ok()) return fail(s);
      }
      Status s = send_bucket(b, weights, round_sum);
      if (!s.ok()) return fail(s);
    }
    if constexpr (std::is_same_v<Source, StreamSource>) {
      Status done = weights.finish();
      if (!done.ok()) return fail(done);
    }
    const std::uint64_t digest = round_sum.digest();
    Status s = fanout->send_all(message(wire::End{plan.bucket_count(), digest}));
    if (!s.ok()) return fail(s);
    {
      profiler::Span span("sync.wait_ack");
      s = fanout->wait_until([](const Peer& p) { return p.acked; }, digest, "acknowledgements");
      if (s.ok()) s = fanout->drain_transfers();
    }
    if (!s.ok()) return fail(s);
    finish_round_stats(&stats, round, weights.size(), plan, start, digest);
    stats.more_follows = round_options.more_follows;
    return stats;
  }

  // Delta rounds on: the DeltaSender sends the round dense or as encoded blobs.
  Result<RoundStats> send_with_delta(std::span<const GatheredTensor> tensors,
                                     const RoundOptions& round_options) {
    const auto start = Clock::now();  // the round's time includes encoding it
    auto prepared = delta->prepare(tensors, fanout->all_peers_share_memory());
    if (!prepared.ok()) return prepared.status();
    wire::Begin fields;
    fields.keep_for_delta = static_cast<std::uint8_t>(prepared->keep_for_delta);
    fields.delta = static_cast<std::uint8_t>(prepared->delta);
    fields.base_version = prepared->base_version;
    fields.targets = std::move(prepared->targets);
    auto stats = prepared->delta
                     ? send_round(GatheredSource(prepared->blobs), round_options, std::move(fields))
                     : send_round(GatheredSource(tensors), round_options, std::move(fields));
    delta->finish_round();  // the snapshot copy of a dense round reads `tensors`
    if (!stats.ok()) {
      delta->require_dense();
      return stats;
    }
    delta->acknowledged(stats->version);
    stats->seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (stats->delta) {
      stats->bytes = 0;
      for (const GatheredTensor& t : tensors) stats->bytes += t.spec.bytes();
    }
    return stats;
  }
};

Sender::Sender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Sender::~Sender() = default;

Result<std::unique_ptr<Sender>> Sender::create(const std::string& address,
                                               const SyncOptions& options) {
  Status s = validate_options(options);
  if (!s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  auto fanout = Fanout::create(address, options, options.slots, options.bucket_bytes);
  if (!fanout.ok()) return fanout.status();
  impl->fanout = std::move(*fanout);
  impl->fanout->set_session(random_session());
  if (options.delta != DeltaMode::kOff) impl->delta = std::make_unique<DeltaSender>(options);
  return std::unique_ptr<Sender>(new Sender(std::move(impl)));
}

Status Sender::accept(std::uint32_t receivers) {
  if (!impl_->broken.ok()) {
    // After a failure, peers join a new session on the same address and ring.
    log::info("sync: starting a new session on {} after: {}", impl_->fanout->address(),
              impl_->broken.message());
    impl_->fanout->drop_peers();
    impl_->fanout->set_session(random_session());
    impl_->broken = ok_status();
  }
  // A receiver that joins holds nothing yet: the next round goes dense.
  if (impl_->delta) impl_->delta->require_dense();
  return impl_->fanout->accept(receivers);
}

Result<RoundStats> Sender::send_round(std::span<const TensorView> weights,
                                      const RoundOptions& round_options) {
  FERRY_RETURN_IF_ERROR(impl_->ready());
  if (impl_->delta) {
    std::vector<GatheredTensor> tensors;
    tensors.reserve(weights.size());
    for (const TensorView& w : weights) tensors.push_back(GatheredTensor{w.spec, {w.data}});
    return impl_->send_with_delta(tensors, round_options);
  }
  return impl_->send_round(ViewSource{weights}, round_options);
}

Result<RoundStats> Sender::send_round_gathered(std::span<const GatheredTensor> weights,
                                               const RoundOptions& round_options) {
  FERRY_RETURN_IF_ERROR(impl_->ready());
  if (impl_->delta) return impl_->send_with_delta(weights, round_options);
  return impl_->send_round(GatheredSource(weights), round_options);
}

Result<RoundStats> Sender::send_round_streamed(std::span<const TensorSpec> specs,
                                               const TensorStream& next,
                                               const RoundOptions& round_options) {
  FERRY_RETURN_IF_ERROR(impl_->ready());
  return impl_->send_round(StreamSource{specs, &next}, round_options);
}

Result<RoundStats> Sender::send_round_filled(std::span<const TensorSpec> specs,
                                             const TensorFill& fill, const FillFlush& flush,
                                             const RoundOptions& round_options) {
  FERRY_RETURN_IF_ERROR(impl_->ready());
  if (impl_->delta) {
    return failed_precondition(
        "send_round_filled: delta rounds need the tensors in memory (use send_round)");
  }
  return impl_->send_round(FillSource{specs, &fill, &flush}, round_options);
}

std::span<std::byte> Sender::ring_memory() const {
  shm::MemfdRing& ring = impl_->fanout->ring();
  return {ring.slot(0), static_cast<std::size_t>(ring.slots()) * ring.slot_bytes()};
}

std::uint64_t Sender::session_id() const { return impl_->fanout->session(); }
std::uint64_t Sender::rounds_sent() const { return impl_->round; }
std::uint32_t Sender::receivers() const {
  return static_cast<std::uint32_t>(impl_->fanout->peers().size());
}
const std::string& Sender::address() const { return impl_->fanout->address(); }
void testing::set_corrupt_slot_hook(CorruptSlot hook) { corrupt_slot_hook() = std::move(hook); }

}  // namespace ferry::sync

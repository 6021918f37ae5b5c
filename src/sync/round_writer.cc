#include "sync/round_writer.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/clock.h"
#include "base/status_macros.h"
#include "profiler/span.h"
#include "sync/round_stats.h"
#include "sync/segment.h"
#include "sync/testing.h"

namespace ferry::sync {
namespace {

testing::CorruptSlot& corrupt_slot_hook() {
  static testing::CorruptSlot hook;
  return hook;
}

// Bytes packed between two turns of the transport's engine: about what a socket buffer
// holds, so a net segment already published keeps flowing while the next is packed.
constexpr std::uint64_t kCopyBetweenMoves = 2 << 20;

}  // namespace

void testing::set_corrupt_slot_hook(CorruptSlot hook) { corrupt_slot_hook() = std::move(hook); }

Status RoundWriter::begin(std::vector<TensorSpec> manifest, const RoundOptions& round_options,
                          wire::Begin fields) {
  // The plan is deterministic from the manifest: reuse it while the manifest is unchanged.
  if (manifest != manifest_ || plan_.bucket_bytes == 0) {
    FERRY_ASSIGN_OR_RETURN(plan_, plan_buckets(manifest, options_.bucket_bytes));
    manifest_ = manifest;
  }
  start_ = Clock::now();
  ++round_;
  fanout_->set_round(round_);
  for (Peer& p : fanout_->peers()) {
    p.released = 0;
    p.acked = false;
  }
  // Peers that map the ring need nothing moved: their copies go in one piece.
  copy_between_moves_ = fanout_->all_peers_share_memory() ? UINT64_MAX : kCopyBetweenMoves;
  packed_since_move_ = 0;
  more_follows_ = round_options.more_follows;
  step_ = round_options.step;
  encoded_ = fields.codec != wire::kDense;
  base_version_ = fields.base_version;
  wire::Begin begin = std::move(fields);
  begin.bucket_bytes = options_.bucket_bytes;
  begin.total_bytes = plan_.total_bytes;
  begin.bucket_count = plan_.bucket_count();
  begin.more_follows = static_cast<std::uint8_t>(more_follows_);
  begin.manifest = std::move(manifest);
  begin.version = round_;
  begin.step = round_options.step;
  const wire::Message message = fanout_->message(std::move(begin));
  const std::vector<std::byte> bytes = wire::encode(message);
  round_sum_.emplace(bytes);
  b_ = 0;
  slot_ = nullptr;
  piece_ = 0;
  in_piece_ = 0;
  segment_begin_ = 0;
  hash_.reset();
  produced_ = false;
  produced_flush_ = nullptr;
  FERRY_RETURN_IF_ERROR(fanout_->send_all_bytes(bytes, message));
  return settle();
}

std::uint64_t RoundWriter::segment_end() const {
  return std::min(plan_.bucket_used[b_], segment_begin_ + kSegmentBytes);
}

Status RoundWriter::settle() {
  while (b_ < plan_.bucket_count()) {
    if (slot_ == nullptr) FERRY_RETURN_IF_ERROR(open_bucket());
    while (!bucket_done() && in_piece_ == plan_.pieces[piece_].length) {
      ++piece_;
      in_piece_ = 0;
    }
    const std::uint64_t used = plan_.bucket_used[b_];
    const std::uint64_t at = bucket_done() ? used : plan_.pieces[piece_].bucket_offset + in_piece_;
    const std::uint64_t end = segment_end();
    // A segment is whole once the cursor passed its end; the last one once the bucket is.
    if (at < end || (end == used && !bucket_done())) return ok_status();
    FERRY_RETURN_IF_ERROR(publish_segment());
  }
  return ok_status();
}

Status RoundWriter::open_bucket() {
  const std::uint32_t k = fanout_->ring().slots();
  if (b_ >= k) {
    // Slot b % k still holds bucket b - k until every receiver released it.
    const std::uint32_t need = b_ - k + 1;
    profiler::Span span("sync.wait_slot", profiler::Detail::kBucket);
    FERRY_RETURN_IF_ERROR(
        fanout_->wait_until([&](const Peer& p) { return p.released >= need; }, 0, "a free slot"));
  }
  slot_ = fanout_->ring().slot(b_ % k);
  piece_ = plan_.bucket_begin[b_];
  in_piece_ = 0;
  segment_begin_ = 0;
  return ok_status();
}

Status RoundWriter::publish_segment() {
  const std::uint64_t end = segment_end();
  const bool last = end == plan_.bucket_used[b_];
  std::uint64_t sum = 0;
  if (produced_) {  // a producer's copies land before the segment is read
    FERRY_RETURN_IF_ERROR(produced_flush_());
    produced_ = false;
    hash_.reset();
  }
  if (options_.checksums) {
    // put() hashed while copying; a producer's bytes are hashed from the slot.
    sum = hash_ ? hash_->finish(end) : BucketHash(slot_, segment_begin_).finish(end);
  }
  hash_.reset();
  round_sum_->add_bucket(b_, end, sum);
  if (corrupt_slot_hook() && segment_begin_ == 0) corrupt_slot_hook()(b_, slot_);
  const std::uint32_t slot = b_ % fanout_->ring().slots();
  {
    profiler::Span span("sync.publish", profiler::Detail::kBucket);
    FERRY_RETURN_IF_ERROR(fanout_->send_all(fanout_->message(
        wire::Filled{slot, b_, end, sum, segment_begin_, static_cast<std::uint8_t>(last)})));
  }
  if (!last) {
    segment_begin_ = end;
  } else {
    ++b_;
    slot_ = nullptr;
  }
  return ok_status();
}

Status RoundWriter::packed(std::uint64_t n) {
  packed_since_move_ += n;
  if (packed_since_move_ < copy_between_moves_) return ok_status();
  packed_since_move_ = 0;
  return fanout_->keep_moving();
}

template <class Write>
Status RoundWriter::pack(std::uint64_t n, Write&& write) {
  FERRY_RETURN_IF_ERROR(settle());
  std::uint64_t done = 0;
  while (done < n) {
    if (b_ == plan_.bucket_count()) {
      return invalid_argument(
          fmt::format("round {}: {} bytes more than the round's {} tensors hold", round_, n - done,
                      manifest_.size()));
    }
    const Piece& p = plan_.pieces[piece_];
    const std::uint64_t at = p.bucket_offset + in_piece_;
    const std::uint64_t m = std::min<std::uint64_t>(
        {n - done, p.length - in_piece_, segment_end() - at, copy_between_moves_});
    FERRY_RETURN_IF_ERROR(write(at, done, m));
    in_piece_ += m;
    done += m;
    FERRY_RETURN_IF_ERROR(packed(m));
    FERRY_RETURN_IF_ERROR(settle());
  }
  return ok_status();
}

Status RoundWriter::put(std::span<const std::byte> bytes) {
  profiler::Span span("sync.pack", profiler::Detail::kBucket);
  return pack(bytes.size(), [&](std::uint64_t at, std::uint64_t from, std::uint64_t m) {
    const std::size_t n = static_cast<std::size_t>(m);
    if (options_.checksums && !produced_) {
      if (!hash_) hash_.emplace(slot_, segment_begin_);
      hash_->copy_piece(slot_ + at, bytes.data() + from, n, at);
    } else {
      copy_bytes(slot_ + at, bytes.data() + from, n);
    }
    return ok_status();
  });
}

Status RoundWriter::produce(std::uint64_t n, const TensorProducer& produce,
                            const FillFlush& flush) {
  profiler::Span span("sync.produce", profiler::Detail::kBucket);
  return pack(n, [&](std::uint64_t at, std::uint64_t from, std::uint64_t m) {
    if (!produced_) {  // the segment is hashed from the slot once the copies landed
      produced_ = true;
      produced_flush_ = flush;
      hash_.reset();
    }
    return produce(from, std::span<std::byte>(slot_ + at, m));
  });
}

Result<RoundStats> RoundWriter::finish() {
  FERRY_RETURN_IF_ERROR(settle());
  if (b_ != plan_.bucket_count()) {
    const Piece& p = plan_.pieces[piece_];
    return invalid_argument(
        fmt::format("round {}: ended before tensor {} '{}' was given whole ({} of its {} bytes)",
                    round_, p.tensor, manifest_[p.tensor].name, p.tensor_offset + in_piece_,
                    manifest_[p.tensor].bytes()));
  }
  const std::uint64_t digest = round_sum_->digest();
  FERRY_RETURN_IF_ERROR(
      fanout_->send_all(fanout_->message(wire::End{plan_.bucket_count(), digest})));
  {
    profiler::Span span("sync.wait_ack");
    FERRY_RETURN_IF_ERROR(
        fanout_->wait_until([](const Peer& p) { return p.acked; }, digest, "acknowledgements"));
    FERRY_RETURN_IF_ERROR(fanout_->drain_transfers());
  }
  RoundStats stats;
  stats.delta = encoded_;
  stats.base_version = base_version_;
  stats.version = round_;
  finish_round_stats(&stats, round_, manifest_.size(), plan_, start_, digest);
  stats.more_follows = more_follows_;
  stats.step = step_;
  return stats;
}

}  // namespace ferry::sync

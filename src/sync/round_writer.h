// The sending end of a session's rounds as an object its caller drives: begin() sends the
// round's BEGIN, put() packs the round's bytes into the ring in manifest order (each full
// segment is hashed and published at once; a new bucket waits only for its slot to be free),
// fill() lets a producer write the slot itself, and finish() sends END and waits for every
// peer's ACK. Sender's send_round* entry points are small adapters over it.
//
//   RoundWriter& w = ...;
//   FERRY_RETURN_IF_ERROR(w.begin(specs, round_options));
//   for (const TensorView& t : weights) FERRY_RETURN_IF_ERROR(w.put(t.data));
//   FERRY_ASSIGN_OR_RETURN(RoundStats stats, w.finish());
//
// The writer does not break the session on an error: its owner (Sender) does, so that a
// round that fails in the caller's producer fails the same way as one that fails here.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "ferry/tensor.h"
#include "sync/bucket_planner.h"
#include "sync/copy.h"
#include "sync/fanout.h"
#include "sync/round_checksum.h"
#include "wire/message.h"

namespace ferry::sync {

class RoundWriter {
 public:
  RoundWriter(Fanout* fanout, SyncOptions options)
      : fanout_(fanout), options_(std::move(options)) {}

  // Plans the round (the plan is reused while the manifest is unchanged) and sends BEGIN.
  // `fields` carries BEGIN's codec fields (codec/tensor_codec.h). REQUIRES: names unique (the
  // caller checks).
  Status begin(std::vector<TensorSpec> manifest, const RoundOptions& round_options,
               wire::Begin fields = {});
  // The round's next bytes: the manifest's tensors in order, each whole or in parts.
  Status put(std::span<const std::byte> bytes);
  // The round's next `n` bytes, written by `produce` itself, perhaps asynchronously: a
  // segment holding such bytes is flushed (`flush`), then hashed from the slot, before it is
  // published.
  Status produce(std::uint64_t n, const TensorProducer& produce, const FillFlush& flush);
  // After the last byte: END, then every peer's ACK. kInvalidArgument if bytes are missing.
  Result<RoundStats> finish();

  std::uint64_t round() const { return round_; }

 private:
  // Moves past pieces already complete, publishing what they complete: the current segment
  // when the cursor reaches its end, the bucket with its last piece.
  Status settle();
  // Claims bucket b_'s slot, waiting until every peer released the bucket it held before.
  Status open_bucket();
  Status publish_segment();
  // Packs the round's next `n` bytes: write(bucket_offset, offset_in_n, length) for each
  // piece, publishing what each piece completes.
  template <class Write>
  Status pack(std::uint64_t n, Write&& write);
  // After `n` more bytes were packed: turns the engine once copy_between_moves_ were
  // (Fanout::keep_moving), so segments already published keep crossing the link.
  Status packed(std::uint64_t n);
  std::uint64_t segment_end() const;
  bool bucket_done() const { return piece_ == plan_.bucket_begin[b_ + 1]; }

  Fanout* fanout_;
  SyncOptions options_;
  std::uint64_t round_ = 0;
  std::vector<TensorSpec> manifest_;
  BucketPlan plan_;

  // The round being written.
  std::uint64_t copy_between_moves_ = UINT64_MAX;  // packed at most between turns
  std::uint64_t packed_since_move_ = 0;
  bool more_follows_ = false;
  std::optional<std::uint64_t> step_;
  bool encoded_ = false;
  std::uint64_t base_version_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::optional<RoundChecksum> round_sum_;
  std::uint32_t b_ = 0;              // the bucket being packed
  std::byte* slot_ = nullptr;        // its slot, once claimed
  std::uint32_t piece_ = 0;          // the next piece to write (index into plan_.pieces)
  std::uint64_t in_piece_ = 0;       // bytes of it written
  std::uint64_t segment_begin_ = 0;  // the bucket's bytes [segment_begin_, segment_end())
  std::optional<BucketHash> hash_;   // of the segment, taken while copying
  // The segment holds bytes a TensorProducer wrote: flushed with produced_flush_, then hashed
  // from the slot, when it is published.
  bool produced_ = false;
  FillFlush produced_flush_;
};

}  // namespace ferry::sync

// Segments: the sender publishes each bucket in slot ranges of at most kSegmentBytes,
// so receivers copy segment s while the sender packs segment s + 1. Without them a
// bucket as large as the model (verl's 2048 MB default against a 1 GB model) would be
// packed whole before any receiver started: no pipelining, half the throughput.
// The bucket size then sets only the ring's memory, not the pipeline's grain.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "sync/bucket_planner.h"

namespace ferry::sync {

inline constexpr std::uint64_t kSegmentBytes = 16ull << 20;

// Walks one bucket's pieces segment by segment, in order.
class SegmentWalker {
 public:
  explicit SegmentWalker(std::span<const Piece> pieces) : pieces_(pieces) {}

  // For the slot range [begin, end): calls part(piece, offset_in_piece, length) for each
  // piece's bytes inside it, then done(piece) for each piece that ends by `end`. On the
  // bucket's last segment every remaining piece ends (empty ones included).
  template <class Part, class Done>
  void walk(std::uint64_t begin, std::uint64_t end, bool last, Part&& part, Done&& done) {
    while (next_ < pieces_.size()) {
      const Piece& p = pieces_[next_];
      const std::uint64_t piece_end = p.bucket_offset + p.length;
      if (p.bucket_offset >= end && !last) return;
      const std::uint64_t lo = std::max(p.bucket_offset, begin);
      const std::uint64_t hi = std::min(piece_end, end);
      if (hi > lo) part(p, lo - p.bucket_offset, hi - lo);
      if (piece_end > end) return;  // continues in the next segment
      done(p);
      ++next_;
    }
  }

 private:
  std::span<const Piece> pieces_;
  std::size_t next_ = 0;
};

}  // namespace ferry::sync

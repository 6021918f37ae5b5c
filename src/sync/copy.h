// The copy routines of the sync path (sender packing, receiver unpacking).
#pragma once

#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t by value, no allocation per bucket
#endif
#include <xxhash.h>
#if defined(__x86_64__)
// XXH3_64bits and XXH3_64bits_update become the library's dispatching versions, which
// use AVX2 or AVX-512 where the CPU has them (the plain ones are built for SSE2): the
// hash taken while copying then costs ~30% of a copy instead of ~100%.
#include <xxh_x86dispatch.h>
#endif

#include <cstddef>
#include <cstdint>
#include <span>

#include "ferry/tensor.h"

namespace ferry::sync {

// Copies n bytes. Copies of at least kStreamingCopyBytes use non-temporal stores:
// glibc switches to them only above __x86_shared_non_temporal_threshold, so the
// 1-64 MiB pieces of a bucket otherwise go through the cache (read-for-ownership on
// every destination line, then write-back), which costs ~40% of the bandwidth.
// docs/benchmarks.md has the measurements.
void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n);

inline constexpr std::size_t kStreamingCopyBytes = 1u << 20;

// The XXH3-64 of a bucket's slot bytes [0, used), taken while its pieces are copied
// into or out of the slot. Each chunk is hashed right after it is copied, while it is
// still in cache, so every byte is read from memory once: hashing the bucket after
// packing it (or before unpacking it) was a second full pass that cost ~40% of the
// round's throughput.
//
//   BucketHash hash(slot);
//   for (const Piece& p : pieces) hash.copy_piece(dst, src, p.length, p.bucket_offset);
//   std::uint64_t sum = hash.finish(used);   // == XXH3_64bits(slot, used)
class BucketHash {
 public:
  // Hashes the slot from `begin` on (a segment of the bucket).
  explicit BucketHash(const std::byte* slot, std::uint64_t begin = 0)
      : slot_(slot), hashed_(begin) {
    XXH3_64bits_reset(&state_);
  }

  // Copies the piece at `bucket_offset` of the slot (src or dst is the slot) and hashes
  // it, after the alignment padding between the previous piece and this one.
  // REQUIRES: pieces come in bucket order and do not overlap.
  void copy_piece(std::byte* dst, const std::byte* src, std::size_t n, std::uint64_t bucket_offset);
  // Hashes the slot from the last piece's end to `used` (the segment's end) and returns
  // the digest.
  std::uint64_t finish(std::uint64_t used);

 private:
  void hash_slot_until(std::uint64_t offset);

  const std::byte* slot_;
  std::uint64_t hashed_;  // slot bytes [begin, hashed_) are in state_
  XXH3_state_t state_;
};

// Copies the bytes of a tensor's piece that a slice selects: the piece is the tensor's bytes
// [tensor_offset, tensor_offset + n) at `src` (bucket offset `bucket_offset`), `runs` a
// TensorSlice's, `slice` its local memory. `hash` (may be null) takes the piece as
// BucketHash::copy_piece would, the bytes passed over included. Returns the bytes copied.
std::uint64_t copy_selected(std::span<const SliceRun> runs, std::byte* slice, const std::byte* src,
                            std::uint64_t tensor_offset, std::uint64_t n,
                            std::uint64_t bucket_offset, BucketHash* hash);

}  // namespace ferry::sync

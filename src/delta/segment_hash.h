// XXH3-64 of a segment's current bytes, fed in order as the encoder passes over them, so
// hashing costs no second read of the segment from memory (encode_into_hashed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry::delta {

class SegmentHash {
 public:
  // Starts the hash of `data`, which must outlive this object. Not thread-safe: one per
  // thread (the XXH3 state is kept per thread).
  explicit SegmentHash(std::span<const std::byte> data);

  // Hashes data[hashed(), end). REQUIRES: hashed() <= end <= data.size().
  void up_to(std::size_t end);
  std::size_t hashed() const { return hashed_; }
  // Hashes the rest and returns XXH3_64bits(data) (seed 0).
  std::uint64_t finish();

 private:
  std::span<const std::byte> data_;
  std::size_t hashed_ = 0;
};

}  // namespace ferry::delta

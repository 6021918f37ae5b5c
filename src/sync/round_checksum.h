// The round checksum both ends compute: XXH3-64 over the BEGIN message (session,
// round, manifest, bucket size) and each bucket's index, size and checksum. It is
// cheap (no second pass over the bytes) and catches a lost, repeated or reordered
// bucket or a manifest that differs between the ends.
#pragma once

#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack, no allocation per round
#endif
#include <xxhash.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "base/coding.h"

namespace ferry::sync {

class RoundChecksum {
 public:
  explicit RoundChecksum(std::span<const std::byte> begin_message) {
    XXH3_64bits_reset(&state_);
    XXH3_64bits_update(&state_, begin_message.data(), begin_message.size());
  }
  void add_bucket(std::uint32_t bucket, std::uint64_t used, std::uint64_t checksum) {
    std::array<std::byte, 20> b;  // no allocation per bucket
    coding::encode_u32(b.data(), bucket);
    coding::encode_u64(b.data() + 4, used);
    coding::encode_u64(b.data() + 12, checksum);
    XXH3_64bits_update(&state_, b.data(), b.size());
  }
  std::uint64_t digest() const { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_;
};

}  // namespace ferry::sync

// What the stateful wire fuzzer and its seed generator share: the session both of its
// Conversations join before the fuzzer's bytes arrive, and the input's record layout.
//
// An input is a sequence of records: one byte naming the side that receives it (even:
// the receiver's Conversation, so the bytes play the sender; odd: the sender's
// Conversation, so they play a receiver), a 16-bit little-endian length, then that many
// bytes of one encoded message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "wire/message.h"

namespace ferry::wire::fuzz {

inline constexpr std::uint64_t kSession = 7;
inline constexpr std::uint32_t kSlots = 2;
inline constexpr std::uint64_t kSlotBytes = 4096;
inline constexpr std::uint32_t kBuckets = 3;  // in round 1, which is under way
inline constexpr std::uint64_t kBucketBytes = 1024;

inline constexpr std::uint8_t kToReceiver = 0;
inline constexpr std::uint8_t kToSender = 1;

inline Message hello() { return {0, 0, Hello{0, 1}}; }
inline Message welcome() { return {kSession, 0, Welcome{kSlots, kSlotBytes, 1}}; }
inline Message begin(std::uint64_t round, std::uint32_t buckets) {
  Begin b;
  b.bucket_bytes = kBucketBytes;
  b.bucket_count = buckets;
  return {kSession, round, b};
}

inline void append_record(std::vector<std::byte>* out, std::uint8_t to, const Message& m) {
  const std::vector<std::byte> bytes = encode(m);
  out->push_back(static_cast<std::byte>(to));
  out->push_back(static_cast<std::byte>(bytes.size() & 0xff));
  out->push_back(static_cast<std::byte>(bytes.size() >> 8));
  out->insert(out->end(), bytes.begin(), bytes.end());
}

}  // namespace ferry::wire::fuzz

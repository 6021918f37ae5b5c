// The messages of a sync session and their one binary layout (docs/protocol.md).
//
// Every message is a 28-byte header (magic, version, type, flags, body length,
// session id, round) followed by a typed body, all little-endian. decode() never
// trusts a length or count it has not checked against the bytes it was given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::wire {

inline constexpr std::uint32_t kMagic = 0x31595246;  // "FRY1" in little-endian bytes
// 2: FILLED announces a segment of a bucket. 3: BEGIN says whether the update continues
// in the next round (an update streamed as several rounds). 4: BEGIN carries the codec
// fields (versions, the tensors the payloads decode into and their hashes; the byte that
// was "delta" 0/1 is the codec id, delta being 1). 5: BEGIN
// carries the caller's step (RoundOptions::step), if it gave one.
inline constexpr std::uint16_t kVersion = 5;
inline constexpr std::size_t kHeaderBytes = 28;
// The largest body any message may carry: a BEGIN manifest of ~1M tensors.
inline constexpr std::size_t kMaxBodyBytes = 64u << 20;
inline constexpr std::size_t kMaxNameBytes = 4096;
inline constexpr std::size_t kMaxRank = 16;
inline constexpr std::size_t kMaxErrorBytes = 64 * 1024;

// Values travel on the wire: never renumber, only append.
enum class MessageType : std::uint8_t {
  kHello = 1,    // receiver -> sender: join the session
  kWelcome = 2,  // sender -> receiver: the ring (its memfd rides along with SCM_RIGHTS)
  kBegin = 3,    // sender -> receivers: a round starts; its manifest
  kFilled = 4,   // sender -> receivers: a slot holds (a segment of) bucket i
  kRelease = 5,  // receiver -> sender: done with bucket i's slot
  kEnd = 6,      // sender -> receivers: the round's last bucket went out
  kAck = 7,      // receiver -> sender: the round arrived whole
  kError = 8,    // either way: the peer gives up, and why
};
std::string_view message_name(MessageType type);

struct Hello {
  std::uint32_t receiver_id = 0;
  std::uint32_t pid = 0;  // for error messages only
};
struct Welcome {
  std::uint32_t slots = 0;
  std::uint64_t slot_bytes = 0;
  std::uint8_t checksums = 1;  // 1: every FILLED carries an XXH3 of its bucket
};
// Codec ids (codec/registry.h names them); 0 is a dense round, whose manifest holds the
// tensors themselves.
inline constexpr std::uint8_t kDense = 0;
// What a payload of an encoded round decodes into: the tensor and the XXH3-64 of its bytes.
struct CodecTarget {
  TensorSpec spec;
  std::uint64_t hash = 0;
};
struct Begin {
  std::uint64_t bucket_bytes = 0;
  std::uint64_t total_bytes = 0;
  std::uint32_t bucket_count = 0;
  // 1: this round is one part of an update and another round of it follows, so the
  // receiver's last bucket of this round is not the update's last (verl's is_last).
  std::uint8_t more_follows = 0;
  std::vector<TensorSpec> manifest;
  // 1: later rounds of this session may decode onto what this round leaves, so a receiver
  // that does not keep the tensors itself (callback modes) keeps a copy.
  std::uint8_t keep_copies = 0;
  // The codec of the round's payloads (kDense: none): manifest entry i is then a U8 payload
  // [len] that decodes into targets[i] (for delta, docs/delta.md, onto base_version's bytes).
  std::uint8_t codec = kDense;
  std::uint64_t base_version = 0;  // what receivers must hold to decode; 0: nothing
  std::uint64_t version = 0;       // what receivers hold after this round
  // The caller's step (RoundOptions::step, e.g. verl's global_steps), not a round number: on
  // the wire a presence flag (0/1) and the value (0 when absent).
  std::optional<std::uint64_t> step;
  std::vector<CodecTarget> targets;  // encoded rounds: one per manifest entry, same name
};
// A bucket is published in segments, so receivers start on a large bucket before the
// sender has filled all of it: the slot now holds the bucket's bytes [offset, used_bytes),
// after the earlier segments' [0, offset). `last` marks the segment that completes it.
struct Filled {
  std::uint32_t slot = 0;
  std::uint32_t bucket = 0;
  std::uint64_t used_bytes = 0;
  std::uint64_t checksum = 0;  // XXH3-64 of bytes [offset, used_bytes); 0 when checksums are off
  std::uint64_t offset = 0;
  std::uint8_t last = 1;
};
struct Release {
  std::uint32_t slot = 0;
  std::uint32_t bucket = 0;
};
// What END states and ACK echoes back: the receiver acknowledges the round only when its own
// count and checksum over the round match the sender's.
struct RoundTotals {
  std::uint32_t bucket_count = 0;
  std::uint64_t round_checksum = 0;
};
struct End : RoundTotals {};
struct Ack : RoundTotals {};
struct Error {
  Code code = Code::kAborted;
  std::string message;
};

using Body = std::variant<Hello, Welcome, Begin, Filled, Release, End, Ack, Error>;

struct Message {
  std::uint64_t session = 0;
  std::uint64_t round = 0;
  Body body;

  MessageType type() const { return static_cast<MessageType>(body.index() + 1); }
  // "FILLED (session 5f.., round 3)" for error messages.
  std::string describe() const;
};

std::vector<std::byte> encode(const Message& message);

// Validates and decodes one whole message. `peer` ("receiver 2", "sender at @ferry")
// names the sender of the bytes in every error.
Result<Message> decode(std::span<const std::byte> bytes, std::string_view peer);

}  // namespace ferry::wire

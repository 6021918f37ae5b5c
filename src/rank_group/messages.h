// The rank group's messages (docs/protocol.md, "Rank groups"). Each message starts with its
// Kind and is at most transport::kMaxMessageBytes, and travels as one message of a
// transport::Channel. Integers are little-endian; a string is a u32
// length and its bytes. Decoders check every length against the bytes they hold before
// they read or allocate, and say what is malformed; what a field means for the group (a
// rank inside it, the version spoken) is checked by the caller, who knows the group.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "rank_group/constants.h"
#include "transport/transport.h"

namespace ferry::rank_group::msg {

enum class Kind : std::uint8_t {
  kJoin = 1,        // rank -> 0
  kTable = 2,       // 0 -> rank
  kPart = 3,        // rank -> 0: a chunk of this rank's part of a collective
  kResult = 4,      // 0 -> rank: a chunk of the collective's result
  kAbort = 5,       // 0 -> rank: the group failed
  kFetchHello = 6,  // fetcher -> server, first on a fetch channel
  kFetch = 7,       // fetcher -> server
  kAnswer = 8,      // server -> fetcher; the answer's bytes follow as a segment, or
                    // come in pieces through a memfd passed with it (shm)
  kPiece = 9,       // server -> fetcher (shm): a piece of the answer is in its slot
  kTaken = 10,      // fetcher -> server (shm): that piece was copied out; its slot is free
};

// The kind of a message (its first byte); 0 for an empty one.
std::uint8_t kind_of(std::span<const std::byte> m);

// kJoin: u16 version, u32 rank, u32 size, node, serve address.
struct Join {
  std::uint16_t version = 0;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::string node;
  std::string address;
};
std::vector<std::byte> encode_join(const Join& join);
Result<Join> decode_join(std::span<const std::byte> m);

// kTable: u32 size, then per rank: node, fetch address.
struct Table {
  std::vector<std::string> nodes;
  std::vector<std::string> addresses;
};
std::vector<std::byte> encode_table(const Table& table);
// `size` ranks exactly.
Result<Table> decode_table(std::span<const std::byte> m, std::uint32_t size);

// kPart / kResult: a blob (a part or a result of any size) as chunks: u64 collective
// number, u64 total size, then up to kBlobChunkBytes of its bytes.
inline constexpr std::size_t kBlobChunkBytes = transport::kMaxMessageBytes - kBlobHeaderBytes;
struct BlobChunk {
  Kind kind = Kind::kPart;
  std::uint64_t seq = 0;
  std::uint64_t total = 0;
  std::span<const std::byte> bytes;  // borrowed from the message
};
std::vector<std::byte> encode_blob_chunk(Kind kind, std::uint64_t seq, std::uint64_t total,
                                         std::string_view bytes);
// A chunk of `kind` (kPart or kResult).
Result<BlobChunk> decode_blob_chunk(std::span<const std::byte> m, Kind kind);

// Reassembles one blob from its chunks, checking each against the collective this rank is
// at and the total its first chunk announced (at most kMaxPayloadBytes); errors name `who`.
struct Blob {
  bool started = false;
  std::uint64_t total = 0;
  std::string data;
  bool complete() const { return started && data.size() == total; }
  Status feed(std::span<const std::byte> m, Kind kind, std::uint64_t seq, const std::string& who);
};

// A collective's result (the blob of kResult): u32 count, then per rank a u64 length and
// the part's bytes.
std::string encode_parts(const std::vector<std::string>& parts);
// `size` parts exactly.
Result<std::vector<std::string>> decode_parts(std::string_view blob, std::uint32_t size);

// kAbort: u8 code (not OK), message: the failure the group stopped for.
struct Abort {
  Code code = Code::kAborted;
  std::string message;
};
std::vector<std::byte> encode_abort(const Status& why);
Result<Abort> decode_abort(std::span<const std::byte> m);

// kFetchHello: u16 version, u32 rank.
struct FetchHello {
  std::uint16_t version = 0;
  std::uint32_t rank = 0;
};
std::vector<std::byte> encode_fetch_hello(const FetchHello& hello);
Result<FetchHello> decode_fetch_hello(std::span<const std::byte> m);

// kFetch: u32 id, u64 expected size (kAnySize: any), the request's bytes (the rest).
struct Fetch {
  std::uint32_t id = 0;
  std::uint64_t expected = 0;
  std::string request;
};
std::vector<std::byte> encode_fetch(const Fetch& fetch);
Result<Fetch> decode_fetch(std::span<const std::byte> m);

// kAnswer: u32 id, u8 code, u64 size, the error message (the rest; code != 0). When the
// code is OK and size > 0, the answer's `size` bytes follow as the channel's next segment
// where it sends segments' bytes (net), else are in a sealed memfd passed with it (shm).
struct Answer {
  std::uint32_t id = 0;
  Code code = Code::kOk;
  std::uint64_t size = 0;
  std::string error;
};
std::vector<std::byte> encode_answer(const Answer& answer);
Result<Answer> decode_answer(std::span<const std::byte> m);

// kPiece / kTaken: u32 answer id, u32 piece number. Piece k of an answer is bytes
// [k * kAnswerSlotBytes, ...) and lies in slot k % kAnswerSlots of the answer's memfd.
struct Piece {
  std::uint32_t id = 0;
  std::uint32_t index = 0;
};
std::vector<std::byte> encode_piece(Kind kind, const Piece& piece);
// A message of `kind` (kPiece or kTaken).
Result<Piece> decode_piece(std::span<const std::byte> m, Kind kind);

}  // namespace ferry::rank_group::msg

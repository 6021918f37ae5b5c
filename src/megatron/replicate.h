// The checkpoint replication protocol in one place (docs/protocol.md, "Checkpoint
// replication"): the messages a replicate server and its pullers exchange over a
// transport::Channel (net between nodes, authenticated; shm on one node), their encoding and
// their validating decoders.
//
// puller                         server
//   LIST                   ->
//                          <-    INDEX (tracker, files: path, bytes, xxh3; notes)
//   GET (path, bytes, xxh3) ->
//                          <-    FILE (path, bytes, xxh3), CHUNK (offset, data) ... | ERROR
//   ... more GETs, more LISTs (a watch) ...
//   DONE                   ->    (a one-shot pull finished)
//
// Every message: magic u32 "FRYR", version u8, kind u8, then the body; integers
// little-endian (wire/coding.h). A decoder checks every length against the bytes left and
// rejects trailing bytes; paths are checked again by their users (validate_relative_path).
//
// File-set mode (ReplicateServeOptions::offer, ReplicatePullOptions::only) uses these same
// messages: only what the INDEX offers, and whose sizes and XXH3s the puller trusts, differ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/megatron.h"
#include "ferry/status.h"

namespace ferry::checkpoint::replicate {

inline constexpr std::uint32_t kMagic = 0x52595246;  // "FRYR" in little-endian bytes
inline constexpr std::uint8_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 6;
inline constexpr std::size_t kMaxPathBytes = 4096;
inline constexpr std::size_t kMaxNoteBytes = 4096;
inline constexpr std::size_t kMaxNotes = 256;

// Values travel on the wire: never renumber.
enum class Kind : std::uint8_t {
  kList = 1,
  kIndex = 2,
  kGet = 3,
  kFile = 4,
  kChunk = 5,
  kError = 6,
  kDone = 7,
};
enum class ErrorCode : std::uint8_t {
  kChanged = 1,     // the file changed since the INDEX: list again
  kNotOffered = 2,  // GET of a file the last INDEX did not offer
  kIo = 3,          // the server could not read its folder
  kBadRequest = 4,  // a message the server does not accept here
};

struct Chunk {
  std::uint64_t offset = 0;
  std::span<const std::byte> data;  // a view into the decoded message
};
struct Error {
  ErrorCode code = ErrorCode::kIo;
  std::string message;
};

std::vector<std::byte> encode_list();
std::vector<std::byte> encode_index(const ReplicaSet& set);
std::vector<std::byte> encode_get(const ReplicaFile& file);
std::vector<std::byte> encode_file(const ReplicaFile& file);
std::vector<std::byte> encode_chunk(std::uint64_t offset, std::span<const std::byte> data);
std::vector<std::byte> encode_error(ErrorCode code, std::string_view message);
std::vector<std::byte> encode_done();

// The kind of a message whose header is valid; corruption naming `peer` otherwise.
Result<Kind> decode_kind(std::span<const std::byte> message, const std::string& peer);
// REQUIRES: decode_kind() gave the matching kind.
Result<ReplicaSet> decode_index(std::span<const std::byte> message, const std::string& peer);
Result<ReplicaFile> decode_get(std::span<const std::byte> message, const std::string& peer);
Result<ReplicaFile> decode_file(std::span<const std::byte> message, const std::string& peer);
Result<Chunk> decode_chunk(std::span<const std::byte> message, const std::string& peer);
Result<Error> decode_error(std::span<const std::byte> message, const std::string& peer);

// Data bytes of a CHUNK message of at most `message_bytes` bytes.
std::size_t max_chunk_bytes(std::size_t message_bytes);

}  // namespace ferry::checkpoint::replicate

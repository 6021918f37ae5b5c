// The local group's messages (docs/protocol.md, "Rank groups"). Each travels as one frame
// on a UNIX-domain stream socket: a u64 little-endian length, then the body below.
// Integers are little-endian; a string is a u64 length and its bytes. Decoders check
// every length against the bytes they hold and reject trailing bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::rank_group::local {

// rank -> 0 on the root address: who the rank is and where it serves fetches.
struct Hello {
  std::uint64_t rank = 0;
  std::string node;
  std::string address;
};
std::string encode_hello(const Hello& hello);
Result<Hello> decode_hello(std::string_view body);

// 0 -> every rank, once all joined: each rank's node and fetch address, by rank.
struct MemberTable {
  std::vector<std::string> nodes;
  std::vector<std::string> addresses;
};
std::string encode_member_table(const MemberTable& table);
// `size` entries exactly.
Result<MemberTable> decode_member_table(std::string_view body, int size);

// A collective: each rank sends its part as a bare frame; rank 0 answers with every part.
std::string encode_parts(const std::vector<std::string>& parts);
// `size` parts exactly.
Result<std::vector<std::string>> decode_parts(std::string_view body, int size);

// fetcher -> server, first on a fetch connection: the fetcher's rank (u64). Requests
// follow as bare frames.
std::string encode_fetch_hello(std::uint64_t rank);
Result<std::uint64_t> decode_fetch_hello(std::string_view body);

// server -> fetcher, per request: a u64 length n (the body's bytes + 1), a u8 status code
// (0 = OK), then n - 1 bytes: the answer, or the error message.
inline constexpr std::size_t kAnswerHeadBytes = 9;
struct AnswerHead {
  std::uint8_t code = 0;
  std::uint64_t body_bytes = 0;
};
void encode_answer_head(const AnswerHead& head, unsigned char (&out)[kAnswerHeadBytes]);
// Checks the length against kMaxPayloadBytes and the code against the codes this build knows.
Result<AnswerHead> decode_answer_head(std::span<const unsigned char, kAnswerHeadBytes> bytes);

}  // namespace ferry::rank_group::local

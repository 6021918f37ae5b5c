#include "rank_group/local_messages.h"

#include "base/coding.h"
#include "rank_group/constants.h"

namespace ferry::rank_group::local {
namespace {

std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
std::string as_text(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

void put_str(std::vector<std::byte>* out, std::string_view s) {
  coding::put_u64(out, s.size());
  coding::put_bytes(out, s);
}
// Reader::bytes() checks the announced length against the bytes left before it allocates.
std::string get_str(coding::Reader& in) { return in.bytes(in.u64()); }

Status malformed(std::string_view what, const coding::Reader& in) {
  return corruption(
      "malformed " + std::string(what) +
      (in.ok() ? " (" + std::to_string(in.remaining()) + " bytes too many)" : " (truncated)"));
}

}  // namespace

std::string encode_hello(const Hello& hello) {
  std::vector<std::byte> out;
  coding::put_u64(&out, hello.rank);
  put_str(&out, hello.node);
  put_str(&out, hello.address);
  return as_text(out);
}

Result<Hello> decode_hello(std::string_view body) {
  coding::Reader in(as_bytes(body));
  Hello h;
  h.rank = in.u64();
  h.node = get_str(in);
  h.address = get_str(in);
  if (!in.ok() || in.remaining() != 0) return malformed("hello", in);
  return h;
}

std::string encode_member_table(const MemberTable& table) {
  std::vector<std::byte> out;
  for (std::size_t r = 0; r < table.nodes.size(); ++r) {
    put_str(&out, table.nodes[r]);
    put_str(&out, table.addresses[r]);
  }
  return as_text(out);
}

Result<MemberTable> decode_member_table(std::string_view body, int size) {
  coding::Reader in(as_bytes(body));
  MemberTable t;
  for (int r = 0; r < size && in.ok(); ++r) {
    t.nodes.push_back(get_str(in));
    t.addresses.push_back(get_str(in));
  }
  if (!in.ok() || in.remaining() != 0) return malformed("member table", in);
  return t;
}

std::string encode_parts(const std::vector<std::string>& parts) {
  std::vector<std::byte> out;
  for (const std::string& p : parts) put_str(&out, p);
  return as_text(out);
}

Result<std::vector<std::string>> decode_parts(std::string_view body, int size) {
  coding::Reader in(as_bytes(body));
  std::vector<std::string> parts;
  for (int r = 0; r < size && in.ok(); ++r) parts.push_back(get_str(in));
  if (!in.ok() || in.remaining() != 0) return malformed("collective result", in);
  return parts;
}

std::string encode_fetch_hello(std::uint64_t rank) {
  std::vector<std::byte> out;
  coding::put_u64(&out, rank);
  return as_text(out);
}

Result<std::uint64_t> decode_fetch_hello(std::string_view body) {
  coding::Reader in(as_bytes(body));
  const std::uint64_t rank = in.u64();
  if (!in.ok() || in.remaining() != 0) return malformed("fetch hello", in);
  return rank;
}

void encode_answer_head(const AnswerHead& head, unsigned char (&out)[kAnswerHeadBytes]) {
  const std::uint64_t n = head.body_bytes + 1;
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(n >> (8 * i));
  out[8] = head.code;
}

Result<AnswerHead> decode_answer_head(std::span<const unsigned char, kAnswerHeadBytes> bytes) {
  coding::Reader in(std::as_bytes(std::span<const unsigned char>(bytes)));
  const std::uint64_t n = in.u64();
  AnswerHead head;
  head.code = in.u8();
  if (n == 0 || n - 1 > kMaxPayloadBytes) {
    return corruption("malformed fetch answer: a length of " + std::to_string(n) +
                      " bytes (at least 1, at most " + std::to_string(kMaxPayloadBytes + 1) + ")");
  }
  if (head.code > static_cast<std::uint8_t>(Code::kInternal)) {
    return corruption("malformed fetch answer: unknown status code " + std::to_string(head.code));
  }
  head.body_bytes = n - 1;
  return head;
}

}  // namespace ferry::rank_group::local

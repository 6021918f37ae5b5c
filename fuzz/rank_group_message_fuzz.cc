// Feeds arbitrary bytes to the decoders of the rank groups' one codec (rank 0 reads joins
// from any process that connects; every rank reads what its peers send): they must never
// crash, read out of bounds or allocate what a length merely claims, and what they accept
// must encode to the same bytes. The first byte picks the decoder.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "rank_group/messages.h"

namespace msg = ferry::rank_group::msg;

namespace {

// The group sizes decoders are asked about: small, as a table of n ranks needs n entries.
constexpr std::uint32_t kSize = 3;

void check(bool same) {
  if (!same) std::abort();
}

std::string_view text_of(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

void fuzz_one(std::uint8_t which, std::span<const std::byte> m) {
  const std::string_view text = text_of(m);
  switch (which % 8) {
    case 0:
      if (auto j = msg::decode_join(m); j.ok()) check(text_of(msg::encode_join(*j)) == text);
      break;
    case 1:
      if (auto t = msg::decode_table(m, kSize); t.ok()) {
        check(text_of(msg::encode_table(*t)) == text);
      }
      break;
    case 2:
      for (auto kind : {msg::Kind::kPart, msg::Kind::kResult}) {
        if (auto c = msg::decode_blob_chunk(m, kind); c.ok()) {
          check(text_of(msg::encode_blob_chunk(kind, c->seq, c->total, text_of(c->bytes))) == text);
        }
      }
      break;
    case 3:
      if (auto p = msg::decode_parts(text, kSize); p.ok()) check(msg::encode_parts(*p) == text);
      break;
    case 4:
      if (auto a = msg::decode_abort(m); a.ok()) {
        check(a->code != ferry::Code::kOk &&
              text_of(msg::encode_abort(ferry::Status(a->code, a->message))) == text);
      }
      break;
    case 5:
      if (auto h = msg::decode_fetch_hello(m); h.ok()) {
        check(text_of(msg::encode_fetch_hello(*h)) == text);
      }
      if (auto f = msg::decode_fetch(m); f.ok()) check(text_of(msg::encode_fetch(*f)) == text);
      break;
    case 6:
      if (auto a = msg::decode_answer(m); a.ok()) check(text_of(msg::encode_answer(*a)) == text);
      for (auto kind : {msg::Kind::kPiece, msg::Kind::kTaken}) {
        if (auto p = msg::decode_piece(m, kind); p.ok()) {
          check(text_of(msg::encode_piece(kind, *p)) == text);
        }
      }
      break;
    case 7: {
      // A stream of chunks as a collective receives them: u16 lengths cut the input into
      // messages. Whatever the peer sends, the blob never holds more than it announced.
      msg::Blob blob;
      while (m.size() >= 2 && !blob.complete()) {
        const std::size_t n = std::min<std::size_t>(
            m.size() - 2, static_cast<std::size_t>(m[0]) | static_cast<std::size_t>(m[1]) << 8);
        if (!blob.feed(m.subspan(2, n), msg::Kind::kPart, 1, "rank 1").ok()) break;
        check(blob.started && blob.data.size() <= blob.total);
        m = m.subspan(2 + n);
      }
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  fuzz_one(data[0], std::as_bytes(std::span(data + 1, size - 1)));
  return 0;
}

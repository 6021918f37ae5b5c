// Feeds arbitrary bytes to the rank groups' message decoders (rank 0 reads hellos from any
// process that connects; every rank reads what its peers send): they must never crash,
// read out of bounds or allocate what a length merely claims, and what they accept must
// encode to bytes that decode to the same fields. The first byte picks the decoder.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include "rank_group/local_messages.h"
#include "rank_group/net_messages.h"

namespace rg = ferry::rank_group;
namespace local = ferry::rank_group::local;
namespace net_msg = ferry::rank_group::net_msg;

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
  switch (which % 12) {
    case 0:
      if (auto h = local::decode_hello(text); h.ok()) {
        auto again = local::decode_hello(local::encode_hello(*h));
        check(again.ok() && again->rank == h->rank && again->node == h->node &&
              again->address == h->address);
      }
      break;
    case 1:
      if (auto t = local::decode_member_table(text, kSize); t.ok()) {
        check(local::encode_member_table(*t) == text);
      }
      break;
    case 2:
      if (auto p = local::decode_parts(text, kSize); p.ok()) check(local::encode_parts(*p) == text);
      break;
    case 3:
      if (auto r = local::decode_fetch_hello(text); r.ok()) {
        check(local::encode_fetch_hello(*r) == text);
      }
      break;
    case 4:
      if (m.size() >= local::kAnswerHeadBytes) {
        const auto* head = reinterpret_cast<const unsigned char*>(m.data());
        if (auto h =
                local::decode_answer_head(std::span<const unsigned char, local::kAnswerHeadBytes>(
                    head, local::kAnswerHeadBytes));
            h.ok()) {
          unsigned char out[local::kAnswerHeadBytes];
          local::encode_answer_head(*h, out);
          check(std::string_view(reinterpret_cast<const char*>(out), sizeof out) ==
                text.substr(0, sizeof out));
        }
      }
      break;
    case 5:
      if (auto j = net_msg::decode_join(m); j.ok()) {
        check(text_of(net_msg::encode_join(*j)) == text);
      }
      break;
    case 6:
      if (auto t = net_msg::decode_table(m, kSize); t.ok()) {
        check(text_of(net_msg::encode_table(*t)) == text);
      }
      break;
    case 7:
      for (auto kind : {net_msg::Kind::kPart, net_msg::Kind::kResult}) {
        if (auto c = net_msg::decode_blob_chunk(m, kind); c.ok()) {
          check(text_of(net_msg::encode_blob_chunk(kind, c->seq, c->total, text_of(c->bytes))) ==
                text);
        }
      }
      break;
    case 8:
      if (auto p = net_msg::decode_parts(text, kSize); p.ok()) {
        check(net_msg::encode_parts(*p) == text);
      }
      break;
    case 9:
      if (auto a = net_msg::decode_abort(m); a.ok()) {
        check(a->code != ferry::Code::kOk &&
              text_of(net_msg::encode_abort(ferry::Status(a->code, a->message))) == text);
      }
      break;
    case 10:
      if (auto h = net_msg::decode_fetch_hello(m); h.ok()) {
        check(text_of(net_msg::encode_fetch_hello(*h)) == text);
      }
      if (auto f = net_msg::decode_fetch(m); f.ok()) {
        check(text_of(net_msg::encode_fetch(*f)) == text);
      }
      break;
    case 11:
      if (auto a = net_msg::decode_answer(m); a.ok()) {
        check(text_of(net_msg::encode_answer(*a)) == text);
      }
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  fuzz_one(data[0], std::as_bytes(std::span(data + 1, size - 1)));
  return 0;
}

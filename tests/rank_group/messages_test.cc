// The rank groups' message codecs: what is encoded decodes to the same fields, and a
// message cut short, padded, of another kind or with an unknown status code is refused
// with a corruption error rather than read past its end.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rank_group/constants.h"
#include "rank_group/local_messages.h"
#include "rank_group/net_messages.h"
#include "support/status_matchers.h"

namespace ferry::rank_group {
namespace {

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s)); }

// Every proper prefix of `m` and `m` plus one byte must fail to decode.
template <typename Decode>
void expect_cut_and_padded_refused(const std::vector<std::byte>& m, Decode decode) {
  for (std::size_t n = 0; n < m.size(); ++n) {
    auto r = decode(std::span<const std::byte>(m.data(), n));
    EXPECT_EQ(r.status().code(), Code::kCorruption) << "prefix of " << n << " bytes";
  }
  std::vector<std::byte> padded = m;
  padded.push_back(std::byte{0});
  EXPECT_EQ(decode(padded).status().code(), Code::kCorruption) << "one byte too many";
}

std::vector<std::byte> to_vector(const std::string& s) {
  auto b = bytes_of(s);
  return {b.begin(), b.end()};
}

TEST(LocalMessages, HelloRoundTripsAndRefusesCutOrPaddedBodies) {
  const std::string body = local::encode_hello({7, "node-1", "@ferry-ckpt-abc-r7"});
  auto h = local::decode_hello(body);
  ASSERT_OK(h);
  EXPECT_EQ(h->rank, 7u);
  EXPECT_EQ(h->node, "node-1");
  EXPECT_EQ(h->address, "@ferry-ckpt-abc-r7");
  expect_cut_and_padded_refused(to_vector(body), [](std::span<const std::byte> b) {
    return local::decode_hello({reinterpret_cast<const char*>(b.data()), b.size()});
  });
}

TEST(LocalMessages, AStringLengthPastTheEndIsRefusedWithoutAllocating) {
  std::string body = local::encode_hello({1, "n", "a"});
  body[8] = '\xff';  // the node's length: now about 2^64 bytes
  for (int i = 9; i < 16; ++i) body[i] = '\xff';
  EXPECT_EQ(local::decode_hello(body).status().code(), Code::kCorruption);
}

TEST(LocalMessages, MemberTableAndPartsHoldExactlyTheGroupsRanks) {
  const std::string table = local::encode_member_table({{"n0", "n1"}, {"@a", "@b"}});
  auto t = local::decode_member_table(table, 2);
  ASSERT_OK(t);
  EXPECT_EQ(t->nodes, (std::vector<std::string>{"n0", "n1"}));
  EXPECT_EQ(t->addresses, (std::vector<std::string>{"@a", "@b"}));
  EXPECT_EQ(local::decode_member_table(table, 3).status().code(), Code::kCorruption);
  EXPECT_EQ(local::decode_member_table(table, 1).status().code(), Code::kCorruption);

  const std::vector<std::string> parts = {"x", "", std::string(1000, 'y')};
  auto p = local::decode_parts(local::encode_parts(parts), 3);
  ASSERT_OK(p);
  EXPECT_EQ(*p, parts);
  EXPECT_EQ(local::decode_parts(local::encode_parts(parts), 2).status().code(), Code::kCorruption);
}

TEST(LocalMessages, AnswerHeadChecksLengthAndCode) {
  unsigned char head[local::kAnswerHeadBytes];
  local::encode_answer_head({static_cast<std::uint8_t>(Code::kNotFound), 12}, head);
  auto h = local::decode_answer_head(head);
  ASSERT_OK(h);
  EXPECT_EQ(h->code, static_cast<std::uint8_t>(Code::kNotFound));
  EXPECT_EQ(h->body_bytes, 12u);

  local::encode_answer_head({0, kMaxPayloadBytes + 1}, head);
  EXPECT_EQ(local::decode_answer_head(head).status().code(), Code::kCorruption);
  local::encode_answer_head({200, 0}, head);
  EXPECT_EQ(local::decode_answer_head(head).status().code(), Code::kCorruption);
  unsigned char zero[local::kAnswerHeadBytes] = {};  // length 0: not even the code byte
  EXPECT_EQ(local::decode_answer_head(zero).status().code(), Code::kCorruption);
}

TEST(NetMessages, JoinRoundTripsAndRefusesCutPaddedOrOtherKinds) {
  const auto m = net_msg::encode_join({kNetVersion, 3, 8, "n1", "10.0.0.2:4000"});
  auto j = net_msg::decode_join(m);
  ASSERT_OK(j);
  EXPECT_EQ(j->version, kNetVersion);
  EXPECT_EQ(j->rank, 3u);
  EXPECT_EQ(j->size, 8u);
  EXPECT_EQ(j->node, "n1");
  EXPECT_EQ(j->address, "10.0.0.2:4000");
  expect_cut_and_padded_refused(m, net_msg::decode_join);
  EXPECT_EQ(net_msg::decode_fetch_hello(m).status().code(), Code::kCorruption);
}

TEST(NetMessages, TableAndPartsHoldExactlyTheGroupsRanks) {
  const auto m = net_msg::encode_table({{"n0", "n1"}, {"h:1", "h:2"}});
  auto t = net_msg::decode_table(m, 2);
  ASSERT_OK(t);
  EXPECT_EQ(t->addresses, (std::vector<std::string>{"h:1", "h:2"}));
  EXPECT_EQ(net_msg::decode_table(m, 3).status().code(), Code::kCorruption);
  expect_cut_and_padded_refused(
      m, [](std::span<const std::byte> b) { return net_msg::decode_table(b, 2); });

  const std::vector<std::string> parts = {"a", std::string(300, 'b'), ""};
  const std::string blob = net_msg::encode_parts(parts);
  auto p = net_msg::decode_parts(blob, 3);
  ASSERT_OK(p);
  EXPECT_EQ(*p, parts);
  EXPECT_EQ(net_msg::decode_parts(blob, 4).status().code(), Code::kCorruption);
  expect_cut_and_padded_refused(to_vector(blob), [](std::span<const std::byte> b) {
    return net_msg::decode_parts({reinterpret_cast<const char*>(b.data()), b.size()}, 3);
  });
}

TEST(NetMessages, BlobChunkCarriesItsBytesAndKind) {
  const auto m = net_msg::encode_blob_chunk(net_msg::Kind::kResult, 5, 100, "abc");
  auto c = net_msg::decode_blob_chunk(m, net_msg::Kind::kResult);
  ASSERT_OK(c);
  EXPECT_EQ(c->seq, 5u);
  EXPECT_EQ(c->total, 100u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c->bytes.data()), c->bytes.size()), "abc");
  EXPECT_EQ(net_msg::decode_blob_chunk(m, net_msg::Kind::kPart).status().code(), Code::kCorruption);
  EXPECT_EQ(
      net_msg::decode_blob_chunk(std::span(m).first(kBlobHeaderBytes - 1), net_msg::Kind::kResult)
          .status()
          .code(),
      Code::kCorruption);
}

TEST(NetMessages, AbortCarriesAFailureAndNeverOk) {
  auto a = net_msg::decode_abort(net_msg::encode_abort(aborted("rank 2 (node n1) is gone")));
  ASSERT_OK(a);
  EXPECT_EQ(a->code, Code::kAborted);
  EXPECT_EQ(a->message, "rank 2 (node n1) is gone");
  auto m = net_msg::encode_abort(aborted("x"));
  m[1] = std::byte{0};  // OK is not a failure
  EXPECT_EQ(net_msg::decode_abort(m).status().code(), Code::kCorruption);
  m[1] = std::byte{250};  // a code this build does not know
  EXPECT_EQ(net_msg::decode_abort(m).status().code(), Code::kCorruption);
}

TEST(NetMessages, FetchAndAnswerRoundTrip) {
  auto f = net_msg::decode_fetch(net_msg::encode_fetch({9, kAnySize, "slice request"}));
  ASSERT_OK(f);
  EXPECT_EQ(f->id, 9u);
  EXPECT_EQ(f->expected, kAnySize);
  EXPECT_EQ(f->request, "slice request");

  const auto m = net_msg::encode_answer({9, Code::kNotFound, 0, "no such slice"});
  auto a = net_msg::decode_answer(m);
  ASSERT_OK(a);
  EXPECT_EQ(a->id, 9u);
  EXPECT_EQ(a->code, Code::kNotFound);
  EXPECT_EQ(a->error, "no such slice");
  auto bad = m;
  bad[5] = std::byte{250};
  EXPECT_EQ(net_msg::decode_answer(bad).status().code(), Code::kCorruption);
  EXPECT_EQ(net_msg::decode_answer(std::span(m).first(13)).status().code(), Code::kCorruption);

  auto h = net_msg::decode_fetch_hello(net_msg::encode_fetch_hello({kNetVersion, 4}));
  ASSERT_OK(h);
  EXPECT_EQ(h->rank, 4u);
  expect_cut_and_padded_refused(net_msg::encode_fetch_hello({kNetVersion, 4}),
                                net_msg::decode_fetch_hello);
}

}  // namespace
}  // namespace ferry::rank_group

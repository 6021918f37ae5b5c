// The rank groups' one message codec (both groups speak it): what is encoded decodes to the
// same fields, and a
// message cut short, padded, of another kind or with an unknown status code is refused
// with a corruption error rather than read past its end.
#include "rank_group/messages.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rank_group/constants.h"
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

TEST(Messages, AStringLengthPastTheEndIsRefusedWithoutAllocating) {
  auto m = msg::encode_join({kVersion, 1, 2, "n", "a"});
  // The node's u32 length (after kind, version, rank and size) claims 4 GiB - 1.
  for (int i = 0; i < 4; ++i) m[1 + 2 + 4 + 4 + i] = std::byte{0xff};
  auto j = msg::decode_join(m);
  EXPECT_EQ(j.status().code(), Code::kCorruption);
  EXPECT_NE(j.status().message().find("malformed join message"), std::string::npos)
      << j.status().message();
}

TEST(Messages, JoinRoundTripsAndRefusesCutPaddedOrOtherKinds) {
  const auto m = msg::encode_join({kVersion, 3, 8, "n1", "10.0.0.2:4000"});
  auto j = msg::decode_join(m);
  ASSERT_OK(j);
  EXPECT_EQ(j->version, kVersion);
  EXPECT_EQ(j->rank, 3u);
  EXPECT_EQ(j->size, 8u);
  EXPECT_EQ(j->node, "n1");
  EXPECT_EQ(j->address, "10.0.0.2:4000");
  expect_cut_and_padded_refused(m, msg::decode_join);
  EXPECT_EQ(msg::decode_fetch_hello(m).status().code(), Code::kCorruption);
}

TEST(Messages, TableAndPartsHoldExactlyTheGroupsRanks) {
  const auto m = msg::encode_table({{"n0", "n1"}, {"h:1", "h:2"}});
  auto t = msg::decode_table(m, 2);
  ASSERT_OK(t);
  EXPECT_EQ(t->addresses, (std::vector<std::string>{"h:1", "h:2"}));
  EXPECT_EQ(msg::decode_table(m, 3).status().code(), Code::kCorruption);
  expect_cut_and_padded_refused(
      m, [](std::span<const std::byte> b) { return msg::decode_table(b, 2); });

  const std::vector<std::string> parts = {"a", std::string(300, 'b'), ""};
  const std::string blob = msg::encode_parts(parts);
  auto p = msg::decode_parts(blob, 3);
  ASSERT_OK(p);
  EXPECT_EQ(*p, parts);
  EXPECT_EQ(msg::decode_parts(blob, 4).status().code(), Code::kCorruption);
  expect_cut_and_padded_refused(to_vector(blob), [](std::span<const std::byte> b) {
    return msg::decode_parts({reinterpret_cast<const char*>(b.data()), b.size()}, 3);
  });
}

TEST(Messages, BlobChunkCarriesItsBytesAndKind) {
  const auto m = msg::encode_blob_chunk(msg::Kind::kResult, 5, 100, "abc");
  auto c = msg::decode_blob_chunk(m, msg::Kind::kResult);
  ASSERT_OK(c);
  EXPECT_EQ(c->seq, 5u);
  EXPECT_EQ(c->total, 100u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c->bytes.data()), c->bytes.size()), "abc");
  EXPECT_EQ(msg::decode_blob_chunk(m, msg::Kind::kPart).status().code(), Code::kCorruption);
  EXPECT_EQ(msg::decode_blob_chunk(std::span(m).first(kBlobHeaderBytes - 1), msg::Kind::kResult)
                .status()
                .code(),
            Code::kCorruption);
}

TEST(Messages, AbortCarriesAFailureAndNeverOk) {
  auto a = msg::decode_abort(msg::encode_abort(aborted("rank 2 (node n1) is gone")));
  ASSERT_OK(a);
  EXPECT_EQ(a->code, Code::kAborted);
  EXPECT_EQ(a->message, "rank 2 (node n1) is gone");
  auto m = msg::encode_abort(aborted("x"));
  m[1] = std::byte{0};  // OK is not a failure
  EXPECT_EQ(msg::decode_abort(m).status().code(), Code::kCorruption);
  m[1] = std::byte{250};  // a code this build does not know
  EXPECT_EQ(msg::decode_abort(m).status().code(), Code::kCorruption);
}

TEST(Messages, FetchAndAnswerRoundTrip) {
  auto f = msg::decode_fetch(msg::encode_fetch({9, kAnySize, "slice request"}));
  ASSERT_OK(f);
  EXPECT_EQ(f->id, 9u);
  EXPECT_EQ(f->expected, kAnySize);
  EXPECT_EQ(f->request, "slice request");

  const auto m = msg::encode_answer({9, Code::kNotFound, 0, "no such slice"});
  auto a = msg::decode_answer(m);
  ASSERT_OK(a);
  EXPECT_EQ(a->id, 9u);
  EXPECT_EQ(a->code, Code::kNotFound);
  EXPECT_EQ(a->error, "no such slice");
  auto bad = m;
  bad[5] = std::byte{250};
  EXPECT_EQ(msg::decode_answer(bad).status().code(), Code::kCorruption);
  EXPECT_EQ(msg::decode_answer(std::span(m).first(13)).status().code(), Code::kCorruption);

  const std::uint64_t big = kMaxPayloadBytes + 1;
  auto huge = msg::decode_answer(msg::encode_answer({9, Code::kOk, big, ""}));
  ASSERT_OK(huge);  // the size is the group's to check, before it takes any bytes
  EXPECT_EQ(huge->size, big);

  auto h = msg::decode_fetch_hello(msg::encode_fetch_hello({kVersion, 4}));
  ASSERT_OK(h);
  EXPECT_EQ(h->rank, 4u);
  expect_cut_and_padded_refused(msg::encode_fetch_hello({kVersion, 4}), msg::decode_fetch_hello);
}

// An answer's pieces (shm): PIECE and TAKEN carry the answer id and the piece number, and
// one is never read as the other.
TEST(Messages, PieceAndTakenRoundTripAndAreNotEachOther) {
  const auto piece = msg::encode_piece(msg::Kind::kPiece, {9, 70000});
  auto p = msg::decode_piece(piece, msg::Kind::kPiece);
  ASSERT_OK(p);
  EXPECT_EQ(p->id, 9u);
  EXPECT_EQ(p->index, 70000u);
  EXPECT_EQ(msg::decode_piece(piece, msg::Kind::kTaken).status().code(), Code::kCorruption);
  const auto taken = msg::encode_piece(msg::Kind::kTaken, {9, 1});
  ASSERT_OK(msg::decode_piece(taken, msg::Kind::kTaken));
  EXPECT_EQ(msg::decode_piece(taken, msg::Kind::kPiece).status().code(), Code::kCorruption);
  expect_cut_and_padded_refused(
      taken, [](std::span<const std::byte> m) { return msg::decode_piece(m, msg::Kind::kTaken); });
}

// A part or result in chunks: each must be of the collective the rank is at, repeat the
// first chunk's total, and stay inside it; a total over kMaxPayloadBytes is refused before
// anything is reserved for it.
TEST(Messages, BlobReassemblesChunksAndRefusesStrayOnes) {
  msg::Blob blob;
  ASSERT_OK(blob.feed(msg::encode_blob_chunk(msg::Kind::kPart, 4, 5, "abc"), msg::Kind::kPart, 4,
                      "rank 1"));
  EXPECT_FALSE(blob.complete());
  ASSERT_OK(blob.feed(msg::encode_blob_chunk(msg::Kind::kPart, 4, 5, "de"), msg::Kind::kPart, 4,
                      "rank 1"));
  EXPECT_TRUE(blob.complete());
  EXPECT_EQ(blob.data, "abcde");

  msg::Blob empty;
  ASSERT_OK(empty.feed(msg::encode_blob_chunk(msg::Kind::kResult, 1, 0, ""), msg::Kind::kResult, 1,
                       "rank 0"));
  EXPECT_TRUE(empty.complete());

  const auto refused = [](std::vector<std::vector<std::byte>> chunks, const std::string& says) {
    msg::Blob b;
    Status s;
    for (const auto& c : chunks) {
      s = b.feed(c, msg::Kind::kPart, 4, "rank 3 (node n1)");
      if (!s.ok()) break;
    }
    EXPECT_EQ(s.code(), Code::kCorruption) << says;
    EXPECT_NE(s.message().find("rank 3 (node n1)"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  };
  refused({msg::encode_blob_chunk(msg::Kind::kPart, 3, 1, "x")}, "collective #3");
  refused({msg::encode_blob_chunk(msg::Kind::kPart, 4, kMaxPayloadBytes + 1, "")},
          "announced a collective part");
  refused({msg::encode_blob_chunk(msg::Kind::kPart, 4, 4, "ab"),
           msg::encode_blob_chunk(msg::Kind::kPart, 4, 6, "cd")},
          "inconsistent");
  refused({msg::encode_blob_chunk(msg::Kind::kPart, 4, 3, "ab"),
           msg::encode_blob_chunk(msg::Kind::kPart, 4, 3, "cd")},
          "oversized");
  refused({msg::encode_blob_chunk(msg::Kind::kResult, 4, 1, "x")}, "malformed collective");
}

}  // namespace
}  // namespace ferry::rank_group

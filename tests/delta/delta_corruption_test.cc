// A delta arrives from a peer: every corrupted or truncated byte must be refused with
// kCorruption before anything is written. The header's checksum covers every byte, so
// every single-byte corruption is refused; the cases that forge a valid checksum check
// the validation behind it (runs in range, the zstd frame's size, no trailing bytes).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/coding.h"
#include "delta/delta.h"
#include "delta/format.h"
#include "delta/training_update.h"
#include "support/status_matchers.h"

namespace ferry::delta {
namespace {

struct Pair {
  std::vector<std::byte> previous, current;
};

Pair sample(std::size_t size, double density) {
  Pair p{std::vector<std::byte>(size), {}};
  change_elements(11, 1.0, 2, p.previous);
  p.current = p.previous;
  change_elements(12, density, 2, p.current);
  return p;
}

// apply() on `encoded` must fail with kCorruption and leave the destination as it was.
void expect_refused(const std::vector<std::byte>& encoded, const std::vector<std::byte>& previous,
                    const std::string& where) {
  std::vector<std::byte> destination = previous;
  const Status s = apply(encoded, destination, "t");
  ASSERT_FALSE(s.ok()) << where;
  EXPECT_EQ(s.code(), Code::kCorruption) << where << ": " << s.to_string();
  ASSERT_TRUE(destination == previous) << where << ": destination written before refusal";
}

TEST(DeltaCorruption, EverySingleByteCorruptionAndTruncationIsRefused) {
  for (const Choice choice : {Choice::kDense, Choice::kRuns, Choice::kXorZstd}) {
    const Pair p = sample(3001, 0.05);
    auto encoded = encode(p.previous, p.current, {.choice = choice});
    ASSERT_OK(encoded);
    SCOPED_TRACE(std::string(encoding_name(static_cast<Encoding>((*encoded)[5]))));
    for (std::size_t i = 0; i < encoded->size(); ++i) {
      for (const std::uint8_t flip : {0x01, 0x80, 0xFF}) {
        std::vector<std::byte> bad = *encoded;
        bad[i] ^= static_cast<std::byte>(flip);
        expect_refused(bad, p.previous, "byte " + std::to_string(i) + " ^ " + std::to_string(flip));
      }
    }
    for (std::size_t length = 0; length < encoded->size(); ++length) {
      std::vector<std::byte> cut(encoded->begin(), encoded->begin() + static_cast<long>(length));
      expect_refused(cut, p.previous, "truncated to " + std::to_string(length));
    }
    std::vector<std::byte> longer = *encoded;
    longer.push_back(std::byte{0});
    expect_refused(longer, p.previous, "one trailing byte");
  }
}

TEST(DeltaCorruption, WrongDestinationSizeIsRefusedNamingBothSizes) {
  const Pair p = sample(100, 0.1);
  auto encoded = encode(p.previous, p.current);
  ASSERT_OK(encoded);
  std::vector<std::byte> destination(99);
  const Status s = apply(*encoded, destination, "layer.0.w");
  EXPECT_EQ(s.code(), Code::kCorruption);
  EXPECT_NE(s.message().find("layer.0.w"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("segment size 100"), std::string::npos) << s.to_string();
}

TEST(DeltaCorruption, EncodeRefusesVersionsOfDifferentLengths) {
  std::vector<std::byte> a(10), b(11);
  EXPECT_EQ(encode(a, b).status().code(), Code::kInvalidArgument);
}

// Forged deltas: a body a buggy or hostile peer could send with a correct checksum.
std::vector<std::byte> forge(Encoding encoding, std::uint64_t segment_bytes, std::uint64_t count,
                             const std::vector<std::byte>& body) {
  std::vector<std::byte> out(kHeaderBytes);
  out.insert(out.end(), body.begin(), body.end());
  write_header({encoding, segment_bytes, body.size(), count}, body, out.data());
  return out;
}

std::vector<std::byte> bytes(std::initializer_list<int> values) {
  std::vector<std::byte> v;
  for (int x : values) v.push_back(static_cast<std::byte>(x));
  return v;
}

void expect_forged_refused(const std::vector<std::byte>& forged, std::size_t segment_bytes,
                           const std::string& expected_words) {
  std::vector<std::byte> destination(segment_bytes, std::byte{7});
  const std::vector<std::byte> before = destination;
  const Status s = apply(forged, destination, "t");
  ASSERT_EQ(s.code(), Code::kCorruption) << expected_words << ": " << s.to_string();
  EXPECT_NE(s.message().find(expected_words), std::string::npos) << s.to_string();
  EXPECT_TRUE(destination == before);
}

TEST(DeltaCorruption, ForgedRunsAreCheckedBehindTheChecksum) {
  // A valid forged delta applies: run at 2 of 3 bytes, then 1 byte after a gap of 1.
  std::vector<std::byte> destination(8, std::byte{0});
  ASSERT_OK(apply(forge(Encoding::kRuns, 8, 2, bytes({2, 3, 1, 2, 3, 1, 1, 9})), destination, "t"));
  EXPECT_TRUE(destination == bytes({0, 0, 1, 2, 3, 0, 9, 0}));

  expect_forged_refused(forge(Encoding::kRuns, 8, 1, bytes({6, 3, 1, 2, 3})), 8,
                        "pass the segment");
  expect_forged_refused(forge(Encoding::kRuns, 8, 1, bytes({9, 1, 1})), 8, "pass the segment");
  expect_forged_refused(forge(Encoding::kRuns, 8, 1, bytes({0, 0})), 8, "empty run");
  expect_forged_refused(forge(Encoding::kRuns, 8, 2, bytes({0, 1, 5, 0, 1, 6})), 8, "gap 0");
  expect_forged_refused(forge(Encoding::kRuns, 8, 1, bytes({0, 3, 1})), 8, "truncated");
  expect_forged_refused(forge(Encoding::kRuns, 8, 2, bytes({0, 1, 5})), 8, "truncated gap");
  expect_forged_refused(forge(Encoding::kRuns, 8, 1, bytes({0, 1, 5, 0})), 8, "trailing");
  expect_forged_refused(forge(Encoding::kRuns, 8, 1, bytes({0x80, 0x00, 1, 5})), 8, "gap");
  // A gap near 2^64 must not wrap around the range check.
  expect_forged_refused(
      forge(Encoding::kRuns, 8, 1,
            bytes({0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 1, 5})),
      8, "pass the segment");
  expect_forged_refused(forge(Encoding::kDense, 8, 1, bytes({1, 2, 3, 4, 5, 6, 7, 8})), 8,
                        "run count");
  expect_forged_refused(forge(Encoding::kDense, 8, 0, bytes({1, 2, 3})), 8, "dense body");
}

TEST(DeltaCorruption, ForgedZstdFramesAreCheckedBehindTheChecksum) {
  const Pair p = sample(5000, 0.1);
  auto encoded = encode(p.previous, p.current, {.choice = Choice::kXorZstd});
  ASSERT_OK(encoded);
  const std::vector<std::byte> frame(encoded->begin() + kHeaderBytes, encoded->end());

  // The frame states 5000 bytes: a destination of another size is refused by the header,
  // and a header forged to agree with that size is refused by the frame.
  expect_forged_refused(forge(Encoding::kXorZstd, 4000, 0, frame), 4000, "decodes to 5000");
  std::vector<std::byte> trailing = frame;
  trailing.push_back(std::byte{0});
  expect_forged_refused(forge(Encoding::kXorZstd, 5000, 0, trailing), 5000, "trailing");
  const std::vector<std::byte> cut(frame.begin(), frame.end() - 3);
  expect_forged_refused(forge(Encoding::kXorZstd, 5000, 0, cut), 5000, "truncated");
  expect_forged_refused(forge(Encoding::kXorZstd, 5000, 0, bytes({1, 2, 3, 4, 5, 6})), 5000,
                        "malformed");
  // Two frames back to back: the second is trailing bytes.
  std::vector<std::byte> twice = frame;
  twice.insert(twice.end(), frame.begin(), frame.end());
  expect_forged_refused(forge(Encoding::kXorZstd, 5000, 0, twice), 5000, "trailing");
}

}  // namespace
}  // namespace ferry::delta

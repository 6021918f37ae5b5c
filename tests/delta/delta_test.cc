#include "delta/delta.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "delta/training_update.h"
#include "support/status_matchers.h"

namespace ferry::delta {
namespace {

Encoding encoding_of(const std::vector<std::byte>& encoded) {
  return static_cast<Encoding>(encoded.at(5));
}

TEST(Delta, RunsCostTheChangedBytesPlusTwoVarintsPerRun) {
  std::vector<std::byte> previous(1000, std::byte{0}), current = previous;
  current[10] = std::byte{1};   // run 1: 1 byte
  current[13] = std::byte{1};   // 2 equal bytes between: merged
  current[500] = std::byte{1};  // run 2, gap 486 (2-byte varint)
  auto encoded = encode(previous, current, {.choice = Choice::kRuns});
  ASSERT_OK(encoded);
  // run 1: gap 10, length 4, 4 bytes; run 2: gap 486 (2 bytes), length 1, 1 byte.
  EXPECT_EQ(encoded->size(), kHeaderBytes + (1 + 1 + 4) + (2 + 1 + 1));
  std::vector<std::byte> destination = previous;
  ASSERT_OK(apply(*encoded, destination, "t"));
  EXPECT_TRUE(destination == current);
}

TEST(Delta, CountsDifferingWordsIncludingAPartialLastWord) {
  std::vector<std::byte> a(21, std::byte{0}), b = a;
  EXPECT_EQ(count_differing_words(a, b), 0u);
  b[0] = b[7] = std::byte{1};  // one word
  b[20] = std::byte{1};        // the partial word
  EXPECT_EQ(count_differing_words(a, b), 2u);
}

// One Adam step with lr 1e-6 on bf16 weights (fp32 master weights, published as bf16): a
// bf16 ulp near 0.02 is 1.2e-4, so an update of 1e-6 crosses a rounding boundary for about
// 1% of the elements. Runs pay at most 2 varints (gap < 2^14: 2 bytes; length: 1 byte) and
// 2 payload bytes per changed element, so they must beat dense by at least 2 / (5 * density).
TEST(Delta, AdamStepOnBf16ChangesAboutOnePercentAndSparseEncodingsBeatDense) {
  const std::size_t elements = 4 << 20;
  std::vector<std::byte> before(2 * elements), after(2 * elements);
  const double density = adam_step_bf16(5, 1e-6, before, after);
  std::cout << "adam step lr 1e-6: " << density * 100 << "% of bf16 elements changed\n";
  EXPECT_GT(density, 0.001);
  EXPECT_LT(density, 0.05);
  const double expected_factor = 2.0 / (5.0 * density);
  std::size_t smallest_forced = SIZE_MAX;
  // Forced runs and xor_zstd, then auto for the fewest bytes, then auto by default.
  const EncodeOptions choices[] = {{.choice = Choice::kRuns},
                                   {.choice = Choice::kXorZstd},
                                   {.choice = Choice::kAuto, .xor_zstd_advantage = 1.0},
                                   {.choice = Choice::kAuto}};
  for (const EncodeOptions& options : choices) {
    auto encoded = encode(before, after, options);
    ASSERT_OK(encoded);
    if (options.choice != Choice::kAuto) {
      smallest_forced = std::min(smallest_forced, encoded->size());
    } else if (options.xor_zstd_advantage == 1.0) {
      EXPECT_LE(encoded->size(), smallest_forced + smallest_forced / 20)
          << "auto: not the smallest";
    }
    const double factor = static_cast<double>(before.size()) / static_cast<double>(encoded->size());
    std::cout << encoding_name(encoding_of(*encoded)) << ": " << factor << "x smaller than dense\n";
    EXPECT_GE(factor, expected_factor) << encoding_name(encoding_of(*encoded));
    std::vector<std::byte> destination = before;
    ASSERT_OK(apply(*encoded, destination, "adam"));
    EXPECT_TRUE(destination == after);
  }
}

// The round compares this hash with XXH3_64bits of each receiver's result: it must be the
// hash of `current` whatever the encoding, including runs that stop at the cap and fall
// back to dense (auto at 100%), segments shorter than a hash block and odd lengths.
TEST(Delta, EncodeIntoHashedGivesXxh3OfCurrentAndTheSameDelta) {
  for (const std::size_t size :
       {std::size_t{0}, std::size_t{5}, std::size_t{16 * 1024}, std::size_t{(1 << 20) + 3}}) {
    for (const double density : {0.0, 0.001, 0.1, 1.0}) {
      std::vector<std::byte> previous(size);
      change_elements(21, 1.0, 2, previous);
      std::vector<std::byte> current = previous;
      if (density > 0) change_elements(22, density, 2, current);
      for (const Choice choice : {Choice::kAuto, Choice::kDense, Choice::kRuns, Choice::kXorZstd}) {
        SCOPED_TRACE(std::to_string(size) + " bytes, density " + std::to_string(density) +
                     ", choice " + std::to_string(static_cast<int>(choice)));
        std::vector<std::byte> hashed, plain;
        std::uint64_t hash = 0;
        ASSERT_OK(encode_into_hashed(previous, current, {.choice = choice}, &hashed, &hash));
        EXPECT_EQ(hash, XXH3_64bits(current.data(), current.size()));
        ASSERT_OK(encode_into(previous, current, {.choice = choice}, &plain));
        EXPECT_TRUE(hashed == plain) << "the hash changed the delta";
      }
    }
  }
}

TEST(Delta, EmptySegmentsEncodeAndApplyForEveryChoice) {
  for (const Choice choice : {Choice::kAuto, Choice::kDense, Choice::kRuns, Choice::kXorZstd}) {
    auto encoded = encode({}, {}, {.choice = choice});
    ASSERT_OK(encoded);
    std::vector<std::byte> none;
    EXPECT_OK(apply(*encoded, none, "empty"));
  }
}

}  // namespace
}  // namespace ferry::delta

// The runs encoder (src/delta/runs.cc: 64-byte masks) against the byte-wise encoder it replaced,
// kept here as the reference: the same body, byte for byte, and the same answer to the cap,
// on random inputs at many densities, lengths 0..300 and every alignment mod 8. Set
// FERRY_DELTA_SEED to replay a failing run (the seed is printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/random.h"
#include "delta/delta.h"
#include "delta/runs.h"
#include "support/status_matchers.h"

namespace ferry::delta {
namespace {

// The format's definition, one byte at a time: each maximal stretch of changed bytes, where
// stretches separated by at most kMaxMergedGap equal bytes merge, as (gap, length, bytes).
std::vector<std::byte> reference_runs(std::span<const std::byte> previous,
                                      std::span<const std::byte> current, std::uint64_t* runs) {
  auto put_varint = [](std::vector<std::byte>* out, std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) out->push_back(static_cast<std::byte>((v & 0x7f) | 0x80));
    out->push_back(static_cast<std::byte>(v));
  };
  const std::size_t n = current.size();
  auto next_difference = [&](std::size_t pos) {
    while (pos < n && previous[pos] == current[pos]) ++pos;
    return pos;
  };
  std::vector<std::byte> body;
  std::size_t last_end = 0;
  *runs = 0;
  for (std::size_t start = next_difference(0); start < n; start = next_difference(last_end)) {
    std::size_t end = start + 1;
    for (;;) {
      while (end < n && previous[end] != current[end]) ++end;
      std::size_t k = end;
      while (k < n && k - end <= kMaxMergedGap && previous[k] == current[k]) ++k;
      if (k >= n || k - end > kMaxMergedGap) break;
      end = k;
    }
    put_varint(&body, start - last_end);
    put_varint(&body, end - start);
    body.insert(body.end(), current.begin() + static_cast<std::ptrdiff_t>(start),
                current.begin() + static_cast<std::ptrdiff_t>(end));
    ++*runs;
    last_end = end;
  }
  return body;
}

std::uint64_t test_seed() {
  if (const char* s = std::getenv("FERRY_DELTA_SEED")) return std::strtoull(s, nullptr, 10);
  return random_u64();
}

TEST(DeltaRuns, WordWiseEncoderMatchesByteWiseReference) {
  const std::uint64_t seed = test_seed();
  std::cout << "FERRY_DELTA_SEED=" << seed << "\n";
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Byte-level change probabilities: from isolated changes to nearly all bytes, so gaps of
  // 0, 1, 2, 3 and more equal bytes all occur, across word and 32-byte block boundaries.
  const double densities[] = {0.0, 0.005, 0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0};
  std::vector<std::byte> previous_buffer(300 + 8), current_buffer(300 + 8);
  int cases = 0;
  for (std::size_t length = 0; length <= 300; ++length) {
    for (const double density : densities) {
      const std::size_t align = rng() % 8;  // independent offsets: unaligned loads
      const std::size_t other_align = rng() % 8;
      std::span<std::byte> previous(previous_buffer.data() + align, length);
      std::span<std::byte> current(current_buffer.data() + other_align, length);
      std::bernoulli_distribution changed(density);
      for (std::size_t i = 0; i < length; ++i) {
        previous[i] = static_cast<std::byte>(rng());
        // A changed byte differs by a nonzero XOR of one bit or of random bits.
        const auto flip =
            rng() % 2 == 0 ? std::uint8_t(1u << (rng() % 8)) : std::uint8_t(1 + rng() % 255);
        current[i] = changed(rng) ? previous[i] ^ static_cast<std::byte>(flip) : previous[i];
      }
      SCOPED_TRACE("length " + std::to_string(length) + ", density " + std::to_string(density) +
                   ", alignments " + std::to_string(align) + "/" + std::to_string(other_align));
      std::uint64_t expected_runs = 0;
      const std::vector<std::byte> expected = reference_runs(previous, current, &expected_runs);
      // Unbounded, then caps just around the body's size: fits exactly when body <= cap.
      std::vector<std::byte> body = {std::byte{0xAA}};  // appends after what is there
      std::uint64_t runs = 0;
      ASSERT_TRUE(encode_runs(previous, current, SIZE_MAX, &body, &runs));
      ASSERT_EQ(runs, expected_runs);
      ASSERT_EQ(body.size(), expected.size() + 1);
      ASSERT_EQ(body[0], std::byte{0xAA});
      ASSERT_TRUE(std::equal(expected.begin(), expected.end(), body.begin() + 1));
      for (const std::size_t cap : {expected.size(), expected.size() + 1, expected.size() - 1,
                                    expected.size() / 2, std::size_t{0}}) {
        if (cap > expected.size() + 1) continue;  // expected.size() - 1 wrapped
        body.clear();
        EXPECT_EQ(encode_runs(previous, current, cap, &body, &runs), expected.size() <= cap)
            << "cap " << cap << ", body " << expected.size();
        EXPECT_LE(body.size(), cap);
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 301 * static_cast<int>(std::size(densities)));
}

// Long stretches, where the encoder skips 32 bytes a step and a run spans many words:
// a few changes placed around block boundaries and one run across kilobytes.
TEST(DeltaRuns, LongStretchesAroundBlockBoundariesMatchReference) {
  std::vector<std::byte> previous(10000, std::byte{7}), current = previous;
  for (const std::size_t at : {31u, 32u, 63u, 64u, 67u, 100u, 101u, 104u, 999u, 9999u}) {
    current[at] = std::byte{8};
  }
  for (std::size_t i = 2000; i < 6000; i += 3) current[i] = std::byte{9};  // gaps of 2: one run
  std::uint64_t expected_runs = 0, runs = 0;
  const std::vector<std::byte> expected = reference_runs(previous, current, &expected_runs);
  std::vector<std::byte> body;
  ASSERT_TRUE(encode_runs(previous, current, SIZE_MAX, &body, &runs));
  EXPECT_EQ(runs, expected_runs);
  EXPECT_TRUE(body == expected);
  std::vector<std::byte> destination = previous;
  auto encoded = encode(previous, current, {.choice = Choice::kRuns});
  ASSERT_OK(encoded);
  ASSERT_OK(apply(*encoded, destination, "long"));
  EXPECT_TRUE(destination == current);
}

}  // namespace
}  // namespace ferry::delta

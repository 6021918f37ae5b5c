// apply(encode(previous, current)) == current, bit for bit, over 50 random steps: sizes from
// 0 bytes to several MiB with odd lengths, sparse and dense updates, each encoding forced
// and auto. Set FERRY_DELTA_SEED to replay a failing run (the seed is printed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "base/random.h"
#include "delta/delta.h"
#include "delta/training_update.h"
#include "support/status_matchers.h"

namespace ferry::delta {
namespace {

std::uint64_t test_seed() {
  if (const char* s = std::getenv("FERRY_DELTA_SEED")) return std::strtoull(s, nullptr, 10);
  return random_u64();
}

TEST(DeltaProperty, ApplyOfEncodeIsCurrentForEveryEncoding) {
  const std::uint64_t seed = test_seed();
  std::cout << "FERRY_DELTA_SEED=" << seed << "\n";
  RecordProperty("seed", std::to_string(seed));
  const std::size_t sizes[] = {0, 1, 2, 7, 9, 4095, 65537, (1u << 20) + 3, (5u << 20) + 1};
  const double densities[] = {0.001, 0.01, 0.1, 1.0};
  // auto as configured by default, auto for the fewest bytes, then each encoding forced.
  const EncodeOptions choices[] = {{.choice = Choice::kAuto},
                                   {.choice = Choice::kAuto, .xor_zstd_advantage = 1.0},
                                   {.choice = Choice::kDense},
                                   {.choice = Choice::kRuns},
                                   {.choice = Choice::kXorZstd}};
  std::vector<std::byte> previous, current;
  for (int step = 0; step < 50; ++step) {
    const std::uint64_t step_seed = seed + static_cast<std::uint64_t>(step) * 1000003;
    const std::size_t size = sizes[step_seed % std::size(sizes)];
    const double density = densities[(step_seed / 7) % std::size(densities)];
    // A step keeps the last version when the size repeats, as rounds do.
    if (previous.size() != size) {
      previous.assign(size, std::byte{0});
      change_elements(step_seed, 1.0, 2, previous);
    } else {
      previous = current;
    }
    current = previous;
    change_elements(step_seed + 1, density, 2, current);
    SCOPED_TRACE("step " + std::to_string(step) + ": " + std::to_string(size) + " bytes, density " +
                 std::to_string(density));
    std::size_t fewest_bytes_auto = 0, smallest_forced = SIZE_MAX;
    for (const EncodeOptions& options : choices) {
      SCOPED_TRACE("choice " + std::to_string(static_cast<int>(options.choice)) + ", advantage " +
                   std::to_string(options.xor_zstd_advantage));
      auto encoded = encode(previous, current, options);
      ASSERT_OK(encoded);
      if (options.choice == Choice::kAuto) {
        EXPECT_LE(encoded->size(), size + kHeaderBytes);
        fewest_bytes_auto = encoded->size();
      } else {
        smallest_forced = std::min(smallest_forced, encoded->size());
      }
      std::vector<std::byte> destination = previous;
      ASSERT_OK(apply(*encoded, destination, "step"));
      ASSERT_TRUE(destination == current);
    }
    // auto decides on an estimate: it may miss the smallest, by little.
    EXPECT_LE(fewest_bytes_auto, smallest_forced + smallest_forced / 8 + 64);
  }
}

TEST(DeltaProperty, AutoPicksSparseEncodingsForSparseUpdatesAndDenseForRandomOnes) {
  const std::uint64_t seed = test_seed();
  std::cout << "FERRY_DELTA_SEED=" << seed << "\n";
  std::vector<std::byte> previous(1 << 20);
  change_elements(seed, 1.0, 2, previous);
  std::vector<std::byte> sparse = previous, random = previous;
  change_elements(seed + 1, 0.001, 2, sparse);
  ASSERT_OK(random_bytes({reinterpret_cast<std::uint8_t*>(random.data()), random.size()}));

  auto small = encode(previous, sparse);
  ASSERT_OK(small);
  EXPECT_LT(small->size(), previous.size() / 50) << "0.1% of elements changed";
  auto full = encode(previous, random);
  ASSERT_OK(full);
  EXPECT_EQ(full->size(), previous.size() + kHeaderBytes) << "random bytes: dense";
  auto same = encode(previous, previous);
  ASSERT_OK(same);
  EXPECT_EQ(same->size(), kHeaderBytes) << "nothing changed: no body";
}

}  // namespace
}  // namespace ferry::delta

#include "base/random.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>
#include <vector>

#include "support/status_matchers.h"

namespace ferry {
namespace {

TEST(RandomBytes, FillsTheWholeSpanWithEveryByteValue) {
  // Every 64 KiB slice, the last included, holds every byte value: a slice left unwritten
  // would not (a random slice misses one with probability about 256 * e^-256).
  std::vector<std::uint8_t> bytes(1 << 20, 0);
  ASSERT_OK(random_bytes(bytes));
  for (std::size_t start = 0; start < bytes.size(); start += 1 << 16) {
    std::array<bool, 256> seen{};
    for (std::size_t i = start; i < start + (1 << 16); ++i) seen[bytes[i]] = true;
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](bool b) { return b; }))
        << "slice at " << start;
  }
}

TEST(RandomBytes, AnEmptySpanIsFine) { EXPECT_OK(random_bytes({})); }

TEST(RandomU64, DoesNotRepeat) {
  std::set<std::uint64_t> values;
  for (int i = 0; i < 10000; ++i) values.insert(random_u64());
  EXPECT_EQ(values.size(), 10000u);  // a repeat among 10^4 draws: about 3e-12
}

}  // namespace
}  // namespace ferry

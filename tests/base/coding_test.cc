#include "base/coding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace ferry::coding {
namespace {

TEST(Coding, FixedEncodingIsLittleEndianAndMatchesPut) {
  std::array<std::byte, 12> fixed{};
  encode_u32(fixed.data(), 0x11223344u);
  encode_u64(fixed.data() + 4, 0x0102030405060708ull);
  EXPECT_EQ(fixed[0], std::byte{0x44});
  EXPECT_EQ(fixed[3], std::byte{0x11});
  EXPECT_EQ(fixed[4], std::byte{0x08});
  EXPECT_EQ(fixed[11], std::byte{0x01});

  std::vector<std::byte> put;
  put_u32(&put, 0x11223344u);
  put_u64(&put, 0x0102030405060708ull);
  ASSERT_EQ(put.size(), fixed.size());
  EXPECT_TRUE(std::equal(put.begin(), put.end(), fixed.begin()));

  Reader r(fixed);
  EXPECT_EQ(r.u32(), 0x11223344u);
  EXPECT_EQ(r.u64(), 0x0102030405060708ull);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.u8(), 0);  // past the end: a failed read, not a crash
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace ferry::coding

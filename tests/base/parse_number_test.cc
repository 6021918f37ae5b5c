#include "base/parse_number.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "support/status_matchers.h"

namespace ferry {
namespace {

TEST(ParseNumber, AcceptsOnlyTheWholeTextAsDigits) {
  EXPECT_EQ(parse_number<std::int64_t>("12345"), 12345);
  EXPECT_EQ(parse_number<std::int64_t>("-7"), -7);
  for (const char* bad : {"", " 1", "1 ", "1x", "+1", "0x10", "1.5", "--1", "١"}) {
    EXPECT_EQ(parse_number<std::int64_t>(bad), std::nullopt) << "'" << bad << "'";
  }
}

TEST(ParseNumber, RejectsWhatDoesNotFit) {
  EXPECT_EQ(parse_number<std::uint64_t>("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_number<std::uint64_t>("18446744073709551616"), std::nullopt);
  EXPECT_EQ(parse_number<std::int32_t>("2147483648"), std::nullopt);
  EXPECT_EQ(parse_number<std::uint64_t>("-1"), std::nullopt);
}

TEST(ParseNumber, ReadsHexadecimalWhenAsked) {
  EXPECT_EQ(parse_number<std::uint64_t>("ffffffffffffffff", 16), UINT64_MAX);
  EXPECT_EQ(parse_number<std::uint64_t>("00ff", 16), 255u);
  EXPECT_EQ(parse_number<std::uint64_t>("0xff", 16), std::nullopt);
}

TEST(ParseUint, HasNoSignAndFitsInt64) {
  EXPECT_EQ(parse_uint("0"), 0);
  EXPECT_EQ(parse_uint("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(parse_uint("9223372036854775808"), std::nullopt);
  EXPECT_EQ(parse_uint("-0"), std::nullopt);
  EXPECT_EQ(parse_uint("-3"), std::nullopt);
}

TEST(ParseNumberField, ErrorNamesTheFieldAndQuotesTheText) {
  ASSERT_OK(parse_number_field<std::uint64_t>("xxh3", "abc", 16));
  const Result<std::uint64_t> bad = parse_number_field<std::uint64_t>("manifest xxh3", "12g", 16);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("manifest xxh3: '12g'"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace ferry

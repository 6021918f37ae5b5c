#include "base/status_macros.h"

#include <gtest/gtest.h>

#include <string>

#include "support/status_matchers.h"

namespace ferry {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("not positive: " + std::to_string(v));
  return v;
}

Result<int> doubled(int v) {
  FERRY_ASSIGN_OR_RETURN(const int x, parse_positive(v));
  return 2 * x;
}

Status check_both(int a, int b, int* calls) {
  FERRY_RETURN_IF_ERROR((++*calls, parse_positive(a)));
  FERRY_RETURN_IF_ERROR(b > 0 ? Status() : invalid_argument("b"));
  return Status();
}

TEST(StatusMacros, AssignOrReturnGivesTheValueOrTheError) {
  ASSERT_OK(doubled(21));
  EXPECT_EQ(doubled(21).value(), 42);
  const auto bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().to_string().find("not positive: -1"), std::string::npos);
}

TEST(StatusMacros, ReturnIfErrorEvaluatesOnceAndStopsAtTheFirstError) {
  int calls = 0;
  EXPECT_OK(check_both(1, 1, &calls));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(check_both(-1, 1, &calls).code(), Code::kInvalidArgument);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(check_both(1, -1, &calls).to_string().find("not positive"), std::string::npos);
}

TEST(StatusMatchers, FailureMessageNamesTheExpressionAndTheError) {
  const auto r = ::ferry::testing::IsOk("load()", not_found("no such checkpoint"));
  ASSERT_FALSE(r);
  const std::string m = r.message();
  EXPECT_NE(m.find("load()"), std::string::npos);
  EXPECT_NE(m.find("no such checkpoint"), std::string::npos);
}

}  // namespace
}  // namespace ferry

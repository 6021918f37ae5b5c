#include "base/overrides.h"

#include <gtest/gtest.h>

#include "support/status_matchers.h"

namespace ferry {
namespace {

TEST(Overrides, ParsesDottedKeysAndHydraPrefixes) {
  auto o = parse_override("++actor_rollout_ref.actor.profiler.tool_config.npu.level=1");
  ASSERT_OK(o);
  EXPECT_EQ(o->key, "actor_rollout_ref.actor.profiler.tool_config.npu.level");
  EXPECT_EQ(o->path.size(), 6u);
  EXPECT_EQ(o->value, "1");
  EXPECT_TRUE(key_ends_with(o->key, "npu.level"));
  EXPECT_FALSE(key_ends_with(o->key, "u.level"));
}

TEST(Overrides, RejectsMissingEqualsAndEmptyComponents) {
  auto no_eq = parse_override("a.b.c");
  ASSERT_FALSE(no_eq.ok());
  EXPECT_NE(no_eq.status().message().find("has no '='"), std::string::npos);
  EXPECT_FALSE(parse_override("a..b=1").ok());
  EXPECT_FALSE(parse_override("=1").ok());
}

TEST(Overrides, ListsWithAndWithoutBrackets) {
  EXPECT_EQ(parse_list_value("npu,cpu"), (std::vector<std::string>{"npu", "cpu"}));
  EXPECT_EQ(parse_list_value("[npu, 'cpu']"), (std::vector<std::string>{"npu", "cpu"}));
  EXPECT_TRUE(parse_list_value("[]").empty());
}

TEST(Overrides, BoolValues) {
  EXPECT_TRUE(*parse_bool_value(*parse_override("x.discrete=True")));
  EXPECT_FALSE(*parse_bool_value(*parse_override("x.discrete=false")));
  auto bad = parse_bool_value(*parse_override("x.discrete=maybe"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("x.discrete=maybe"), std::string::npos);
}

}  // namespace
}  // namespace ferry

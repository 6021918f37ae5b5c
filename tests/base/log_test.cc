#include "base/log.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace ferry {
namespace {

// Regression: the first get() used to re-enter its own static initialiser and abort.
TEST(Log, FirstUseDoesNotRecurse) {
  log::info("first message");
  SUCCEED();
}

TEST(Log, FerryLevelWinsAndVerlLevelIsTheFallback) {
  ::setenv("VERL_LOGGING_LEVEL", "DEBUG", 1);
  ::unsetenv("FERRY_LOG_LEVEL");
  log::reload_level_from_env();
  EXPECT_EQ(log::get().level(), spdlog::level::debug);
  ::setenv("FERRY_LOG_LEVEL", "error", 1);
  log::reload_level_from_env();
  EXPECT_EQ(log::get().level(), spdlog::level::err);
  ::setenv("FERRY_LOG_LEVEL", "loud", 1);
  log::reload_level_from_env();
  EXPECT_EQ(log::get().level(), spdlog::level::info);
  ::unsetenv("FERRY_LOG_LEVEL");
  ::unsetenv("VERL_LOGGING_LEVEL");
  log::reload_level_from_env();
}

TEST(Log, ParsesBothVocabularies) {
  spdlog::level::level_enum l;
  ASSERT_TRUE(log::parse_level("WARNING", &l));
  EXPECT_EQ(l, spdlog::level::warn);
  ASSERT_TRUE(log::parse_level("trace", &l));
  EXPECT_EQ(l, spdlog::level::trace);
  EXPECT_FALSE(log::parse_level("verbose", &l));
}

}  // namespace
}  // namespace ferry

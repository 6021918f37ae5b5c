#include "base/log.h"

#include <gtest/gtest.h>

#include <chrono>
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
// A flood of refusals writes a few lines a second, and the next line says what was dropped.
TEST(Log, LimiterLetsAFewLinesASecondThroughAndCountsTheRest) {
  log::Limiter limiter(2);
  const auto t0 = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  std::uint64_t dropped = 99;
  EXPECT_TRUE(limiter.allow(t0, &dropped));
  EXPECT_EQ(dropped, 0u);
  EXPECT_TRUE(limiter.allow(t0, &dropped));
  for (int i = 0; i < 1000; ++i)
    EXPECT_FALSE(limiter.allow(t0 + std::chrono::milliseconds(500), &dropped));
  EXPECT_TRUE(limiter.allow(t0 + std::chrono::seconds(1), &dropped));
  EXPECT_EQ(dropped, 1000u);
  EXPECT_TRUE(limiter.allow(t0 + std::chrono::seconds(1), &dropped));
  EXPECT_EQ(dropped, 0u);
}

}  // namespace ferry

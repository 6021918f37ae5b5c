// ASSERT_OK / EXPECT_OK for Status and Result<T>: on failure the message names the code and
// the error text, where ASSERT_TRUE(x.ok()) would print only "false".
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ferry/status.h"

namespace ferry::testing {

inline const Status& status_of(const Status& s) { return s; }
template <typename T>
const Status& status_of(const Result<T>& r) {
  return r.status();
}

inline ::testing::AssertionResult IsOk(const char* expr, const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expr << " failed: " << s.to_string();
}

}  // namespace ferry::testing

#define ASSERT_OK(expr) \
  ASSERT_TRUE(::ferry::testing::IsOk(#expr, ::ferry::testing::status_of(expr)))
#define EXPECT_OK(expr) \
  EXPECT_TRUE(::ferry::testing::IsOk(#expr, ::ferry::testing::status_of(expr)))

#include "ferry/status.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "support/status_matchers.h"

namespace ferry {
namespace {

TEST(Status, DefaultIsOkAndCheap) {
  Status s;
  EXPECT_OK(s);
  EXPECT_EQ(s.code(), Code::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.to_string(), "ok");
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = corruption("model.safetensors: header length 12 exceeds file size 9");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kCorruption);
  EXPECT_EQ(s.to_string(), "corruption: model.safetensors: header length 12 exceeds file size 9");
  Status copy = s;
  EXPECT_EQ(copy, s);
}

TEST(Status, WithContextPrefixesMessageAndKeepsOk) {
  EXPECT_OK(Status().with_context("ignored"));
  Status s = not_found("no such tensor").with_context("shard-1.safetensors");
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), "shard-1.safetensors: no such tensor");
}

TEST(Status, ErrnoStatusNamesCallAndTargetAndMapsCodes) {
  Status s = errno_status("open", "/x/y", ENOENT);
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_NE(s.message().find("open(/x/y)"), std::string::npos);
  EXPECT_EQ(errno_status("write", "f", ENOSPC).code(), Code::kResourceExhausted);
  EXPECT_EQ(errno_status("read", "f", EIO).code(), Code::kIoError);
}

TEST(Result, HoldsValueOrError) {
  Result<int> good = 7;
  ASSERT_OK(good);
  EXPECT_EQ(*good, 7);
  Result<int> bad = invalid_argument("bad --layers: -1");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry

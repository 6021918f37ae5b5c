// Net sessions in the sync tests: the secret in a token file, and the options most of them
// share.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <string>

#include "ferry/sync.h"
#include "support/test_support.h"

namespace ferry::sync::testing {

inline constexpr const char* kTestSecret = ::ferry::testing::kTestToken;

// `secret` in dir/name, mode 0600 (the transport refuses a file others may read); its path.
inline std::string write_token(ferry::testing::TempDir& dir,
                               const std::string& secret = kTestSecret,
                               const std::string& name = "token") {
  const std::string path = dir.file(name);
  ferry::testing::write_bytes(path, secret);
  EXPECT_EQ(::chmod(path.c_str(), 0600), 0);
  return path;
}

// 64 KiB buckets (a 300 KiB tensor spans several), a 10 s timeout, a token in `dir`.
inline SyncOptions net_options(ferry::testing::TempDir& dir) {
  SyncOptions o;
  o.bucket_bytes = 64 << 10;
  o.timeout = std::chrono::milliseconds(10'000);
  o.token_file = write_token(dir);
  return o;
}

}  // namespace ferry::sync::testing

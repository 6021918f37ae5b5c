// AtomicFile under a failing disk: whatever fails (a write, the fsync, the rename), the file
// it replaces keeps its old contents, no temp file is left behind, and the error names the
// file and the failed call.
#include "base/atomic_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/file_util.h"
#include "support/fault_env.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry {
namespace {

using testing::FaultEnv;
using testing::TempDir;

// Every file in `dir`, by name.
std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

class AtomicFileFaults : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK(write_file_atomic(path_, "old contents")); }

  // The old file is still whole and alone in its folder.
  void expect_old_file_untouched() {
    auto text = read_file(path_);
    ASSERT_OK(text);
    EXPECT_EQ(*text, "old contents");
    EXPECT_EQ(files_in(dir_.path()), std::vector<std::string>{"weights.json"});
  }

  TempDir dir_;
  const std::string path_ = dir_.file("weights.json");
  FaultEnv env_;
};

TEST_F(AtomicFileFaults, FullDiskIsResourceExhaustedNamingTheFile) {
  env_.fail_writes_from(1, ENOSPC);
  Status s;
  {
    ScopedEnvOverride use(env_);
    s = write_file_atomic(path_, std::string(4096, 'x'));
  }
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("write(" + path_ + ".tmp."), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.to_string();
  EXPECT_EQ(env_.faults(), 1);
  expect_old_file_untouched();
}

TEST_F(AtomicFileFaults, ALaterWriteFailingLeavesTheOldFile) {
  env_.fail_writes_from(3, EIO);
  ScopedEnvOverride use(env_);
  {
    auto file = AtomicFile::create(path_);
    ASSERT_OK(file);
    EXPECT_OK(file->write(as_bytes("first ")));
    EXPECT_OK(file->write(as_bytes("second ")));
    Status third = file->write(as_bytes("third"));
    EXPECT_EQ(third.code(), Code::kIoError) << third.to_string();
    EXPECT_EQ(env_.writes(), 3);
  }  // dropped uncommitted, as a writer does after an error
  expect_old_file_untouched();
}

TEST_F(AtomicFileFaults, FailedFsyncLeavesTheOldFile) {
  env_.fail_sync(EIO);
  Status s;
  {
    ScopedEnvOverride use(env_);
    s = write_file_atomic(path_, "new contents");
  }
  EXPECT_EQ(s.code(), Code::kIoError) << s.to_string();
  EXPECT_NE(s.message().find("fsync(" + path_ + ".tmp."), std::string::npos) << s.to_string();
  expect_old_file_untouched();
}

TEST_F(AtomicFileFaults, FailedRenameLeavesTheOldFile) {
  env_.fail_rename(EIO);
  Status s;
  {
    ScopedEnvOverride use(env_);
    s = write_file_atomic(path_, "new contents");
  }
  EXPECT_EQ(s.code(), Code::kIoError) << s.to_string();
  EXPECT_NE(s.message().find("rename(" + path_ + ")"), std::string::npos) << s.to_string();
  expect_old_file_untouched();
}

TEST_F(AtomicFileFaults, FaultsOnOtherFilesDoNotTouchThisOne) {
  env_.fail_writes_from(1, ENOSPC, "other.json");
  env_.fail_sync(EIO, "other.json");
  env_.fail_rename(EIO, "other.json");
  {
    ScopedEnvOverride use(env_);
    EXPECT_OK(write_file_atomic(path_, "new contents"));
  }
  EXPECT_EQ(env_.writes(), 1);  // the write went through the Env
  EXPECT_EQ(env_.faults(), 0);
  auto text = read_file(path_);
  ASSERT_OK(text);
  EXPECT_EQ(*text, "new contents");
  EXPECT_EQ(files_in(dir_.path()), std::vector<std::string>{"weights.json"});
}

TEST_F(AtomicFileFaults, HealedEnvWritesAgain) {
  env_.fail_writes_from(1, ENOSPC);
  ScopedEnvOverride use(env_);
  EXPECT_FALSE(write_file_atomic(path_, "new contents").ok());
  env_.heal();
  EXPECT_OK(write_file_atomic(path_, "new contents"));
  auto text = read_file(path_);
  ASSERT_OK(text);
  EXPECT_EQ(*text, "new contents");
}

TEST(ScopedEnvOverride, NestsAndRestoresThePreviousEnv) {
  EXPECT_EQ(&Env::current(), &Env::posix());
  FaultEnv outer, inner;
  {
    ScopedEnvOverride a(outer);
    EXPECT_EQ(&Env::current(), &outer);
    {
      ScopedEnvOverride b(inner);
      EXPECT_EQ(&Env::current(), &inner);
    }
    EXPECT_EQ(&Env::current(), &outer);
  }
  EXPECT_EQ(&Env::current(), &Env::posix());
}

}  // namespace
}  // namespace ferry

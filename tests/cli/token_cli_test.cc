// `ferry token new` and `ferry token check`: how a user gets a token net sessions accept.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "support/test_support.h"

namespace ferry {
namespace {

using testing::run_ferry;

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(TokenCli, NewWritesA0600FileThatCheckAccepts) {
  testing::TempDir dir;
  auto r = run_ferry({"token", "new"}, {"HOME=" + dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string path = dir.file(".ferry/token");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(first_line(path).size(), 64u);
  EXPECT_NE(r.out.find("FERRY_TOKEN_FILE=" + path), std::string::npos) << r.out;

  auto check = run_ferry({"token", "check"}, {"FERRY_TOKEN_FILE=" + path});
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(check.out.find("OK"), std::string::npos);
  EXPECT_EQ(check.out.find(first_line(path)), std::string::npos) << "check printed the secret";
}

TEST(TokenCli, NewKeepsAnExistingTokenUnlessForced) {
  testing::TempDir dir;
  const std::string path = dir.file("token");
  ASSERT_EQ(run_ferry({"token", "new", path}).exit_code, 0);
  const std::string before = first_line(path);
  auto again = run_ferry({"token", "new", path});
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("--force"), std::string::npos) << again.err;
  EXPECT_EQ(first_line(path), before);
  EXPECT_EQ(run_ferry({"token", "new", path, "--force"}).exit_code, 0);
  EXPECT_NE(first_line(path), before);
}

TEST(TokenCli, CheckRefusesAWeakToken) {
  auto r = run_ferry({"token", "check"}, {"FERRY_TOKEN=s3cret"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("weak token"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ferry token new"), std::string::npos);
}

TEST(TokenCli, CheckOfAFileReadsThatFileNotTheEnvironment) {
  testing::TempDir dir;
  const std::string path = dir.file("token");
  ASSERT_EQ(run_ferry({"token", "new", path}).exit_code, 0);
  auto r = run_ferry({"token", "check", path}, {"FERRY_TOKEN=s3cret"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("token file " + path), std::string::npos) << r.out;
}

TEST(TokenCli, CheckRefusesATokenFileOthersCanRead) {
  testing::TempDir dir;
  const std::string path = dir.file("token");
  ASSERT_EQ(run_ferry({"token", "new", path}).exit_code, 0);
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto r = run_ferry({"token", "check", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("chmod 600 " + path), std::string::npos) << r.err;
}

TEST(TokenCli, CheckWithoutAnyTokenNamesTheVariablesToSet) {
  auto r = run_ferry({"token", "check"}, {"PATH=/usr/bin:/bin"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("FERRY_TOKEN_FILE"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ferry

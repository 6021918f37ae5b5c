// Progress output on a terminal and off one, and the size units every
// command prints (MiB = 2^20 bytes, GiB = 2^30; never a bare MB or GB).
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>

#include "support/test_support.h"

namespace ferry {
namespace {

using testing::run_ferry;
using testing::TempDir;

// Runs ferry with stdout and stderr on one pseudo-terminal, as a user sees it.
std::string run_on_terminal(const std::vector<std::string>& args, int* exit_code) {
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  if (pid == 0) {
    std::vector<char*> argv;
    std::string bin = FERRY_BINARY;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    std::_Exit(127);
  }
  std::string out;
  if (pid < 0) return out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(master, buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO once the child's side is closed
    }
  }
  ::close(master);
  int status = 0;
  ::waitpid(pid, &status, 0);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(ProgressCli, TerminalBarEndsItsLineBeforeTheSummary) {
  TempDir dir;
  int rc = -1;
  const std::string out = run_on_terminal(
      {"gen-model", "--preset", "qwen2.5-0.5b", "--layers", "1", "--out", dir.file("m")}, &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::size_t summary = out.find("wrote ");
  ASSERT_NE(summary, std::string::npos) << out;
  ASSERT_GT(summary, 0u) << out;
  EXPECT_EQ(out[summary - 1], '\n') << "summary glued to the bar:\n" << out;
  // The last drawing of the bar (the terminal turns its "\n" into "\r\n"): 100%,
  // the total and that it is done.
  const std::size_t full = out.rfind("100.0%", summary);
  ASSERT_NE(full, std::string::npos) << out;
  const std::size_t bar = out.rfind('\r', full);
  ASSERT_NE(bar, std::string::npos) << out;
  const std::string last = out.substr(bar, summary - bar);
  EXPECT_TRUE(std::regex_search(last, std::regex(R"(of [0-9.]+ (MiB|GiB))"))) << last;
  EXPECT_NE(last.find("done"), std::string::npos) << last;
}

TEST(ProgressCli, OffATerminalAShortCommandPrintsNoBar) {
  TempDir dir;
  const auto r =
      run_ferry({"gen-model", "--preset", "qwen3-0.6b", "--layers", "1", "--out", dir.file("m")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('['), std::string::npos) << r.err;
}

TEST(ProgressCli, PlainLinesAtEachQuarterWhenAsked) {
  TempDir dir;
  const auto r =
      run_ferry({"gen-model", "--preset", "qwen3-0.6b", "--layers", "1", "--out", dir.file("m")},
                {"FERRY_PROGRESS=plain"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  // Mid-way lines give the total, the rate and an ETA; the last one says done.
  EXPECT_TRUE(std::regex_search(
      r.err,
      std::regex(
          R"(gen-model qwen3-0\.6b: 50% of [0-9.]+ (MiB|GiB), [0-9.]+ (MiB|GiB)/s, ETA [0-9]+m[0-9]+s\n)")))
      << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex(R"(gen-model qwen3-0\.6b: 100% of [0-9.]+ (MiB|GiB), .*done\n)")))
      << r.err;
  int lines = 0;
  for (char c : r.err) lines += c == '\n';
  EXPECT_LE(lines, 4) << r.err;  // sparse: one per quarter at most
}

// "No bare MB/GB": a printed size names a binary unit.
void expect_binary_units(const std::string& what, const std::string& text) {
  EXPECT_FALSE(std::regex_search(text, std::regex(R"([0-9] ?(MB|GB)\b)"))) << what << ":\n" << text;
}

TEST(UnitsCli, GenModelAdviseBucketAndExplainPrintMiB) {
  TempDir dir;
  const auto gen =
      run_ferry({"gen-model", "--preset", "qwen2.5-0.5b", "--layers", "1", "--out", dir.file("m")});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  expect_binary_units("gen-model", gen.out);
  // The size gen-model prints is the folder's tensor bytes in MiB.
  const auto j = run_ferry({"gen-model", "--preset", "qwen2.5-0.5b", "--layers", "1", "--json",
                            "--force", "--out", dir.file("m")});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const double bytes = nlohmann::json::parse(j.out)["bytes"].get<double>();
  char mib[64];
  std::snprintf(mib, sizeof(mib), "%.1f MiB", bytes / (1 << 20));
  EXPECT_NE(gen.out.find(mib), std::string::npos) << mib << "\n" << gen.out;

  const auto advise = run_ferry({"advise-bucket", "--shape", "151936x4096", "--dtype", "float32"});
  ASSERT_EQ(advise.exit_code, 0) << advise.err;
  expect_binary_units("advise-bucket", advise.out);
  EXPECT_NE(advise.out.find("2374.0 MiB"), std::string::npos) << advise.out;  // 2489319424 / 2^20
  EXPECT_NE(advise.out.find("4096 MiB"), std::string::npos) << advise.out;

  const auto explain =
      run_ferry({"explain",
                 "AssertionError: Weight model.embed_tokens.weight(torch.Size([151936, 4096]), "
                 "torch.float32) is too large to fit in the bucket.Please increase "
                 "rollout.update_weights_bucket_megabytes(2048 MB)."});
  ASSERT_EQ(explain.exit_code, 0) << explain.err;
  // The "seen:" line quotes verl's own message ("2048 MB"); what ferry writes is MiB.
  std::string own;
  for (std::size_t at = 0; at < explain.out.size();) {
    const std::size_t end = explain.out.find('\n', at);
    const std::string line = explain.out.substr(at, end - at);
    if (line.find("seen:") == std::string::npos) own += line + "\n";
    at = end == std::string::npos ? explain.out.size() : end + 1;
  }
  expect_binary_units("explain", own);
  EXPECT_NE(own.find("2374.0 MiB"), std::string::npos) << own;
}

}  // namespace
}  // namespace ferry

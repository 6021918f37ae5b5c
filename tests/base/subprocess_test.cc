#include "base/subprocess.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "support/status_matchers.h"

namespace ferry {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

TEST(Subprocess, ReportsTheExitCodeAndCapturesBothStreams) {
  auto child = Subprocess::spawn({"sh", "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_OK(child);
  const Subprocess::Finished done = child->finish(Deadline(seconds(20)));
  EXPECT_EQ(done.exit.code, 3);
  EXPECT_EQ(done.exit.signal, 0);
  EXPECT_FALSE(done.exit.timed_out);
  EXPECT_EQ(done.out, "out\n");
  EXPECT_EQ(done.err, "err\n");
}

TEST(Subprocess, MergedOutputCarriesBothStreamsInOrder) {
  SpawnOptions options;
  options.output = ChildOutput::kMerged;
  auto child = Subprocess::spawn({"sh", "-c", "echo one; echo two >&2; echo three"}, options);
  ASSERT_OK(child);
  const Subprocess::Finished done = child->finish(Deadline(seconds(20)));
  EXPECT_EQ(done.exit.code, 0);
  EXPECT_EQ(done.out, "one\ntwo\nthree\n");
  EXPECT_EQ(done.err, "");
}

TEST(Subprocess, ExtraEnvironmentWinsAndAPrefixIsDropped) {
  ASSERT_EQ(::setenv("FERRY_SUBPROCESS_TEST_INHERITED", "parent", 1), 0);
  ASSERT_EQ(::setenv("FERRY_SUBPROCESS_TEST_OVERRIDDEN", "parent", 1), 0);
  const std::string script =
      "echo \"${FERRY_SUBPROCESS_TEST_INHERITED:-unset} $FERRY_SUBPROCESS_TEST_OVERRIDDEN\"";
  SpawnOptions options;
  options.env = {"FERRY_SUBPROCESS_TEST_OVERRIDDEN=child"};
  auto inherited = Subprocess::spawn({"sh", "-c", script}, options);
  ASSERT_OK(inherited);
  EXPECT_EQ(inherited->finish(Deadline(seconds(20))).out, "parent child\n");

  options.drop_inherited_prefix = "FERRY_SUBPROCESS_TEST_";
  auto dropped = Subprocess::spawn({"sh", "-c", script}, options);
  ASSERT_OK(dropped);
  EXPECT_EQ(dropped->finish(Deadline(seconds(20))).out, "unset child\n");
}

TEST(Subprocess, ReadsLinesThenTheUnterminatedRest) {
  SpawnOptions options;
  options.output = ChildOutput::kMerged;
  auto child = Subprocess::spawn({"printf", "first\nsecond\nrest"}, options);
  ASSERT_OK(child);
  const Deadline deadline(seconds(20));
  EXPECT_EQ(child->read_line(deadline).value(), "first");
  EXPECT_EQ(child->read_line(deadline).value(), "second");
  EXPECT_EQ(child->read_line(deadline).value(), "rest");
  EXPECT_EQ(child->read_line(deadline).status().code(), Code::kNotFound);
  EXPECT_EQ(child->wait(deadline)->code, 0);
}

TEST(Subprocess, ReadLineTimesOutOnASilentChild) {
  auto child = Subprocess::spawn({"sleep", "30"});
  ASSERT_OK(child);
  EXPECT_EQ(child->read_line(Deadline(milliseconds(100))).status().code(), Code::kTimeout);
}

TEST(Subprocess, FinishKillsAChildThatOutlivesTheDeadline) {
  SpawnOptions options;
  options.own_process_group = true;
  // The shell's own child (the sleep) holds the pipe too: the group is killed, not just sh.
  auto child = Subprocess::spawn({"sh", "-c", "echo started; sleep 30; echo never"}, options);
  ASSERT_OK(child);
  const auto start = Clock::now();
  const Subprocess::Finished done = child->finish(Deadline(milliseconds(300)));
  EXPECT_LT(Clock::now() - start, seconds(10));
  EXPECT_TRUE(done.exit.timed_out);
  EXPECT_EQ(done.exit.signal, SIGKILL);
  EXPECT_EQ(done.exit.code, 128 + SIGKILL);
  EXPECT_EQ(done.out, "started\n");
}

TEST(Subprocess, WaitReturnsNothingWhileTheChildRuns) {
  auto child = Subprocess::spawn({"sleep", "30"});
  ASSERT_OK(child);
  EXPECT_FALSE(child->wait(Deadline(milliseconds(50))).has_value());
  child->signal(SIGTERM);
  const auto exit = child->wait(Deadline(seconds(20)));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGTERM);
}

TEST(Subprocess, DestroyingARunningChildKillsAndReapsIt) {
  pid_t pid = -1;
  {
    auto child = Subprocess::spawn({"sleep", "30"});
    ASSERT_OK(child);
    pid = child->pid();
    ASSERT_TRUE(alive(pid));
  }
  EXPECT_FALSE(alive(pid));  // reaped, not a zombie: kill(pid, 0) fails
}

TEST(Subprocess, AMissingProgramIsNamedInTheError) {
  auto missing = Subprocess::spawn({"ferry-no-such-program-x7", "--flag"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find("ferry-no-such-program-x7"), std::string::npos)
      << missing.status().to_string();

  auto missing_path = Subprocess::spawn({"/nonexistent/ferry-tool"});
  ASSERT_FALSE(missing_path.ok());
  EXPECT_NE(missing_path.status().message().find("/nonexistent/ferry-tool"), std::string::npos)
      << missing_path.status().to_string();
}

TEST(Subprocess, AnEmptyCommandIsRejected) {
  EXPECT_EQ(Subprocess::spawn({}).status().code(), Code::kInvalidArgument);
}

TEST(Subprocess, CaptureStopsAtTheLimitButTheChildRunsToTheEnd) {
  auto child = Subprocess::spawn({"sh", "-c", "head -c 100000 /dev/zero; exit 7"});
  ASSERT_OK(child);
  const Subprocess::Finished done = child->finish(Deadline(seconds(20)), 1000);
  EXPECT_EQ(done.out.size(), 1000u);
  EXPECT_EQ(done.exit.code, 7);
}

TEST(Subprocess, ForkRunsTheBodyAndReturnsWhatItWrote) {
  auto child = Subprocess::fork(
      [](int out_fd) {
        const char text[] = "from the child";
        return ::write(out_fd, text, sizeof text - 1) == sizeof text - 1 ? 5 : 1;
      },
      "test child");
  ASSERT_OK(child);
  EXPECT_EQ(child->name(), "test child");
  const Subprocess::Finished done = child->finish(Deadline(seconds(20)));
  EXPECT_EQ(done.out, "from the child");
  EXPECT_EQ(done.exit.code, 5);
}

}  // namespace
}  // namespace ferry

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/file_util.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry {
namespace {

using testing::run_ferry;
using testing::TempDir;

// Issue 7's acceptance: the demo under verl's profiler overrides writes traces that parse,
// one per round with discrete=true, and their summary shows the sync stages.
TEST(DemoProfileCli, WritesParsableTracesWhoseSummaryShowsSyncStages) {
  TempDir dir;
  auto r = run_ferry({"demo", "--vocab", "2048", "--hidden", "256", "--bucket-mb", "1", "--json",
                      "--profile-dir", dir.path(),
                      "actor_rollout_ref.actor.profiler.tool_config.npu.discrete=true",
                      "actor_rollout_ref.actor.profiler.tool_config.npu.level=1",
                      "actor_rollout_ref.actor.profiler.tool_config.npu.contents=npu,cpu"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> traces;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() == ".json") traces.push_back(e.path().string());
  }
  // One continuous step trace plus one per round (3 rounds).
  int round_files = 0;
  for (const std::string& t : traces) {
    auto text = read_file(t);
    ASSERT_OK(text);
    auto j = nlohmann::json::parse(*text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << t;
    round_files += t.find("sync_round") != std::string::npos;
  }
  EXPECT_EQ(round_files, 3);
  std::vector<std::string> args = {"trace", "summarize", "--json"};
  args.insert(args.end(), traces.begin(), traces.end());
  auto summary = run_ferry(args);
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  for (const char* stage : {"sync.send_round", "sync.pack", "sync.wait_slot"}) {
    EXPECT_NE(summary.out.find(stage), std::string::npos) << stage << "\n" << summary.out;
  }
}

TEST(DemoProfileCli, BadProfilerValueIsAUsageErrorListingAllowedValues) {
  auto r = run_ferry({"demo", "--vocab", "16", "--hidden", "16",
                      "actor_rollout_ref.actor.profiler.tool_config.npu.level=level9"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("level0"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ferry

// Checkpoints over the network rank group on 127.0.0.1: saved on one set of nodes and
// loaded on another with slices that must come over the network, and a rank killed
// mid-save (this test binary re-executed, see rank_group/net_group_test_util.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "base/clock.h"
#include "checkpoint/testing.h"
#include "ckpt_test_util.h"
#include "rank_group/net_group_test_util.h"

namespace ferry::checkpoint {
namespace {

using rank_group::test::ChildRank;
using rank_group::test::connect_as_child_rank;
using rank_group::test::free_root_address;
using rank_group::test::net_connect;
using rank_group::test::node_of_layout;
using rank_group::test::options;
using rank_group::test::run_all_but;
using rank_group::test::seconds_since;
using std::chrono::milliseconds;
using test::make_state;

void run_child(const char* role) {
  const std::unique_ptr<RankGroup> g = connect_as_child_rank();
  if (std::strcmp(role, "die-after-shards") == 0) {
    const std::string root_dir = std::getenv("FERRY_NET_GROUP_TEST_DIR");
    set_save_phase_hook_for_testing([](std::string_view phase) {
      if (phase == "shards") std::raise(SIGKILL);
    });
    Checkpointer ckpt(*g, {.root = root_dir + "/" + g->node()});
    auto slices = test::cut_all(make_state(41), g->rank(), g->size(), 0);
    auto v = test::views(slices);
    (void)ckpt.save(2, v);
  }
  std::_Exit(4);
}

const bool kChildRan = [] {
  if (const char* role = std::getenv("FERRY_NET_GROUP_TEST_CHILD")) run_child(role);
  return false;
}();

// ---- checkpoints across nodes ----

TEST(NetGroupCheckpoint, SavedOnTwoNodesLoadedOnOneWithTheOtherNodesSlicesOverTheNetwork) {
  testing::TempDir dir;
  const auto state = make_state(31);
  test::save_state(dir.path(), state, 4, 2, 1, "{}",
                   net_connect());  // ranks 0, 1 on n0; 2, 3 on n1
  // Ranks 0 and 1 on n0 load, split along dim 1 this time; the slices of the old ranks 2
  // and 3 are only on n1's disk, so they come over the network from the rank on n1.
  const auto r = test::load_and_check(dir.path(), state, 3, 2, 1, std::nullopt, net_connect());
  EXPECT_EQ(r.step, 1);
  EXPECT_GT(r.remote, 0u);
  EXPECT_GT(r.local, 0u);
  EXPECT_EQ(r.local + r.remote, test::state_bytes(state));
}

TEST(NetGroupCheckpoint, EightRanksOnFourNodes) {
  testing::TempDir dir;
  const auto state = make_state(32);
  test::save_state(dir.path(), state, 8, 4, 7, "{}", net_connect());
  for (int n = 0; n < 4; ++n) {
    EXPECT_TRUE(
        std::filesystem::exists(dir.path() + "/n" + std::to_string(n) + "/step_7/manifest.json"));
  }
  const auto r = test::load_and_check(dir.path(), state, 8, 4, 1, std::nullopt, net_connect());
  EXPECT_EQ(r.step, 7);
  EXPECT_GT(r.remote, 0u);
  EXPECT_EQ(r.local + r.remote, test::state_bytes(state));
}

// ---- refusals and failures ----

TEST(KilledNetSaver, TheOthersFailAtOnceAndThePreviousStepStaysLoadable) {
  testing::TempDir dir;
  const auto old_state = make_state(40);
  test::save_state(dir.path(), old_state, 4, 2, 1, "{}", net_connect());
  const std::string root = free_root_address();
  // Rank 2 (node n1) writes its shards and dies before the manifest is agreed on.
  ChildRank child("die-after-shards", root, 2, 4, "n1", dir.path());
  std::mutex mu;
  std::vector<std::pair<Status, double>> results;
  run_all_but(
      root, 4, 2, [](int r) { return node_of_layout(r, 4, 2); },
      [&](RankGroup& g) {
        Checkpointer ckpt(g, {.root = dir.path() + "/" + g.node()});
        auto slices = test::cut_all(make_state(41), g.rank(), g.size(), 0);
        auto v = test::views(slices);
        const auto t = Clock::now();
        Status s = ckpt.save(2, v);
        std::lock_guard<std::mutex> lock(mu);
        results.emplace_back(s, seconds_since(t));
      });
  const int st = child.wait_status();
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
  ASSERT_EQ(results.size(), 3u);
  for (const auto& [s, secs] : results) {
    EXPECT_EQ(s.code(), Code::kAborted) << s.to_string();
    EXPECT_NE(s.message().find("rank 2 (node n1)"), std::string::npos) << s.to_string();
    EXPECT_LT(secs, 5.0) << s.to_string();
  }
  EXPECT_EQ(test::load_and_check(dir.path(), old_state, 4, 2, 0, std::nullopt, net_connect()).step,
            1);
}

}  // namespace
}  // namespace ferry::checkpoint

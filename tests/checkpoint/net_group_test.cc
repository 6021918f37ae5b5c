// The network rank group (UCX, token-authenticated) on 127.0.0.1: collectives and fetches,
// checkpoints saved on one set of nodes and loaded on another with slices that must come
// over the network, a wrong token, a hung rank, and ranks killed mid-collective and
// mid-fetch.
//
// Ranks are threads, each with its own group. A rank that gets killed is this test binary
// re-executed (posix_spawn with FERRY_NET_GROUP_TEST_CHILD set), not a bare fork: UCX state
// of a process that already used it does not survive a fork.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "base/clock.h"
#include "ckpt_test_util.h"

extern char** environ;

namespace ferry::checkpoint {
namespace {

using std::chrono::milliseconds;
using test::make_state;

constexpr const char* kToken = "net-group-test-secret-0123456789abcdefghij";

// For rank 0 to listen on: a port below the ephemeral range (test_support.h says why).
std::string free_root_address() { return testing::unused_loopback_address(); }

NetGroupOptions options(const std::string& root, int rank, int size, std::string node) {
  NetGroupOptions o;
  o.root_address = root;
  o.rank = rank;
  o.size = size;
  o.node = std::move(node);
  o.serve_address = "127.0.0.1:0";
  o.token = kToken;
  o.timeout = milliseconds(10'000);
  o.collective_timeout = milliseconds(20'000);
  return o;
}

// Joins net groups at a fresh root address; `tweak` may change a rank's options.
test::Connect net_connect(const std::function<void(NetGroupOptions&)>& tweak = {}) {
  return [root = free_root_address(), tweak](int rank, int size, const std::string& node) {
    NetGroupOptions o = options(root, rank, size, node);
    if (tweak) tweak(o);
    return connect_net_group(o);
  };
}

// Runs `fn(group)` for every rank of a net group on its own thread.
void run_net_group(int size, const std::function<std::string(int)>& node_of,
                   const std::function<void(RankGroup&)>& fn,
                   const std::function<void(NetGroupOptions&)>& tweak = {}) {
  test::run_group(size, node_of, fn, net_connect(tweak));
}

std::string node_of_layout(int rank, int ranks, int nodes) {
  return "n" + std::to_string(rank * nodes / ranks);
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- ranks in child processes ----

void run_child(const char* role) {
  const std::string root = std::getenv("FERRY_NET_GROUP_TEST_ROOT");
  const int rank = std::atoi(std::getenv("FERRY_NET_GROUP_TEST_RANK"));
  const int size = std::atoi(std::getenv("FERRY_NET_GROUP_TEST_SIZE"));
  NetGroupOptions o = options(root, rank, size, std::getenv("FERRY_NET_GROUP_TEST_NODE"));
  o.collective_timeout = milliseconds(60'000);
  auto g = connect_net_group(o);
  if (!g.ok()) std::_Exit(2);
  if (std::strcmp(role, "die-in-collective") == 0) {
    // The others are in the all_gather after this barrier when this rank dies.
    if (!(*g)->barrier().ok()) std::_Exit(3);
    std::this_thread::sleep_for(milliseconds(300));
    std::raise(SIGKILL);
  }
  if (std::strcmp(role, "die-in-fetch") == 0) {
    (*g)->set_fetch_handler([](int, std::string_view) -> Result<RankGroup::FetchReply> {
      std::raise(SIGKILL);
      return internal_error("unreachable");
    });
    if (!(*g)->barrier().ok()) std::_Exit(3);
    while (true) std::this_thread::sleep_for(milliseconds(100));  // until a fetch kills it
  }
  if (std::strcmp(role, "die-after-shards") == 0) {
    const std::string root_dir = std::getenv("FERRY_NET_GROUP_TEST_DIR");
    Checkpointer ckpt(**g,
                      {.root = root_dir + "/" + o.node, .test_hook = [](std::string_view phase) {
                         if (phase == "shards") std::raise(SIGKILL);
                       }});
    auto slices = test::cut_all(make_state(41), rank, size, 0);
    auto v = test::views(slices);
    (void)ckpt.save(2, v);
  }
  std::_Exit(4);
}

const bool kChildRan = [] {
  if (const char* role = std::getenv("FERRY_NET_GROUP_TEST_CHILD")) run_child(role);
  return false;
}();

// This binary re-executed as rank `rank` of a group at `root`, playing `role`. Killed and
// reaped on destruction if still there.
class ChildRank {
 public:
  ChildRank(const std::string& role, const std::string& root, int rank, int size,
            const std::string& node, const std::string& dir = "") {
    std::vector<std::string> env = {"FERRY_NET_GROUP_TEST_CHILD=" + role,
                                    "FERRY_NET_GROUP_TEST_ROOT=" + root,
                                    "FERRY_NET_GROUP_TEST_RANK=" + std::to_string(rank),
                                    "FERRY_NET_GROUP_TEST_SIZE=" + std::to_string(size),
                                    "FERRY_NET_GROUP_TEST_NODE=" + node,
                                    "FERRY_NET_GROUP_TEST_DIR=" + dir};
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "FERRY_NET_GROUP_TEST_", 21) != 0) env.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    char self[4096] = {};
    EXPECT_GT(::readlink("/proc/self/exe", self, sizeof self - 1), 0);
    char* argv[] = {self, nullptr};
    EXPECT_EQ(::posix_spawn(&pid_, self, nullptr, nullptr, argv, envp.data()), 0);
  }
  ~ChildRank() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
    (void)wait_status();
  }
  // Its wait status, once it ended.
  int wait_status() {
    if (pid_ > 0) {
      ::waitpid(pid_, &status_, 0);
      pid_ = -1;
    }
    return status_;
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

// Runs `fn(group)` on a thread for every rank of a group at `root` but `skip`, which a
// child process plays. Collectives wait long: a failure must not come from a timeout.
void run_all_but(const std::string& root, int size, int skip,
                 const std::function<std::string(int)>& node_of,
                 const std::function<void(RankGroup&)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    if (r == skip) continue;
    threads.emplace_back([&, r] {
      NetGroupOptions o = options(root, r, size, node_of(r));
      o.collective_timeout = milliseconds(60'000);
      auto g = connect_net_group(o);
      ASSERT_TRUE(g.ok()) << g.status().to_string();
      fn(**g);
    });
  }
  for (std::thread& t : threads) t.join();
}

// ---- collectives and fetches ----

TEST(NetGroup, CollectivesAcrossNodes) {
  // 70 MiB from rank 1 is more than one control message: parts travel in chunks.
  const std::string big(70u << 20, 'x');
  std::atomic<int> done{0};
  run_net_group(
      3, [](int r) { return node_of_layout(r, 3, 2); },
      [&](RankGroup& g) {
        EXPECT_EQ(g.size(), 3);
        EXPECT_EQ(g.node(), node_of_layout(g.rank(), 3, 2));
        std::string mine = "part of rank " + std::to_string(g.rank());
        if (g.rank() == 1) mine += big;
        auto all = g.all_gather(mine);
        ASSERT_TRUE(all.ok()) << all.status().to_string();
        ASSERT_EQ(all->size(), 3u);
        EXPECT_EQ((*all)[0], "part of rank 0");
        EXPECT_EQ((*all)[1], "part of rank 1" + big);
        EXPECT_EQ((*all)[2], "part of rank 2");
        auto b = g.broadcast(g.rank() == 2 ? "from two" : "ignored", 2);
        ASSERT_TRUE(b.ok()) << b.status().to_string();
        EXPECT_EQ(*b, "from two");
        auto empty = g.all_gather("");
        ASSERT_TRUE(empty.ok());
        EXPECT_EQ(*empty, std::vector<std::string>(3));
        for (int i = 0; i < 20; ++i) ASSERT_TRUE(g.barrier().ok());
        EXPECT_EQ(g.broadcast("", 3).status().code(), Code::kInvalidArgument);
        ++done;
      });
  EXPECT_EQ(done.load(), 3);
}

TEST(NetGroup, FetchesAnswerFromHandlersAndCarryTheirErrors) {
  // 8 MiB that a handler lends from its own memory, as a mapped shard is lent.
  std::vector<std::byte> lent(8u << 20);
  for (std::size_t i = 0; i < lent.size(); ++i) lent[i] = static_cast<std::byte>(i * 131 + 7);
  auto keep = std::make_shared<int>(0);
  // Serving on every interface: each rank is advertised as the address rank 0 saw it at.
  const auto everywhere = [](NetGroupOptions& o) { o.serve_address = "0.0.0.0:0"; };
  run_net_group(
      3, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        const int me = g.rank();
        const int peer = (me + 1) % 3;
        ASSERT_EQ(g.fetch(peer, "before").status().code(), Code::kFailedPrecondition);
        ASSERT_TRUE(g.barrier().ok());  // nobody asks before every rank had its no-handler answer
        g.set_fetch_handler(
            [&, me](int from, std::string_view req) -> Result<RankGroup::FetchReply> {
              if (req == "lent") return RankGroup::FetchReply{{}, lent, keep};
              if (req == "missing") {
                return not_found("rank " + std::to_string(me) + " has no such thing");
              }
              return RankGroup::FetchReply{"rank " + std::to_string(me) + " answers rank " +
                                               std::to_string(from) + ": " + std::string(req),
                                           {},
                                           nullptr};
            });
        ASSERT_TRUE(g.barrier().ok());
        auto text = g.fetch(peer, "hello");
        ASSERT_TRUE(text.ok()) << text.status().to_string();
        EXPECT_EQ(*text, "rank " + std::to_string(peer) + " answers rank " + std::to_string(me) +
                             ": hello");
        auto self = g.fetch(me, "x");
        ASSERT_TRUE(self.ok()) << self.status().to_string();
        EXPECT_EQ(*self,
                  "rank " + std::to_string(me) + " answers rank " + std::to_string(me) + ": x");

        std::vector<std::byte> into(lent.size());
        ASSERT_TRUE(g.fetch_into(peer, "lent", into).ok());
        EXPECT_EQ(testing::hash_bytes(into), testing::hash_bytes(lent));

        std::vector<std::byte> wrong(100);
        Status s = g.fetch_into(peer, "lent", wrong);
        EXPECT_EQ(s.code(), Code::kCorruption) << s.to_string();
        EXPECT_NE(s.message().find("rank " + std::to_string(peer)), std::string::npos)
            << s.to_string();
        EXPECT_NE(s.message().find("expected 100"), std::string::npos) << s.to_string();
        s = g.fetch(peer, "missing").status();
        EXPECT_EQ(s.code(), Code::kNotFound);
        EXPECT_EQ(s.message(), "rank " + std::to_string(peer) + " has no such thing");
        // The channel is still in step after both errors.
        auto again = g.fetch(peer, "again");
        ASSERT_TRUE(again.ok()) << again.status().to_string();
        EXPECT_NE(again->find(": again"), std::string::npos);
        EXPECT_EQ(g.fetch(3, "x").status().code(), Code::kInvalidArgument);
        ASSERT_TRUE(g.barrier().ok());
        g.set_fetch_handler({});
      },
      everywhere);
}

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

TEST(NetGroup, WrongTokenIsRefusedAndBothSidesNameTheOther) {
  const std::string root = free_root_address();
  Status at_root, at_joiner;
  std::thread rank0([&] {
    NetGroupOptions o = options(root, 0, 2, "n0");
    o.timeout = milliseconds(2000);
    at_root = connect_net_group(o).status();
  });
  std::thread rank1([&] {
    NetGroupOptions o = options(root, 1, 2, "n1");
    o.token = "another secret-0123456789abcdefghij";
    at_joiner = connect_net_group(o).status();
  });
  rank0.join();
  rank1.join();
  EXPECT_EQ(at_joiner.code(), Code::kUnauthenticated) << at_joiner.to_string();
  EXPECT_NE(at_joiner.message().find("rank 0 (the group's root) at " + root + " refused our token"),
            std::string::npos)
      << at_joiner.to_string();
  EXPECT_EQ(at_root.code(), Code::kUnauthenticated) << at_root.to_string();
  EXPECT_NE(at_root.message().find("rank(s) 1 did not join"), std::string::npos)
      << at_root.to_string();
  EXPECT_NE(at_root.message().find("peer 127.0.0.1:"), std::string::npos) << at_root.to_string();
  EXPECT_NE(at_root.message().find("failed authentication: wrong token"), std::string::npos)
      << at_root.to_string();
}

TEST(NetGroup, HungRankHitsTheCollectiveTimeoutAndIsNamed) {
  std::mutex mu;
  std::vector<Status> errors;
  std::atomic<int> finished{0};
  const auto t0 = Clock::now();
  run_net_group(
      3, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        if (g.rank() == 2) {  // joined, but never reaches the barrier
          while (finished.load() < 2) std::this_thread::sleep_for(milliseconds(10));
          return;
        }
        Status s = g.barrier();
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(s);
        ++finished;
      },
      [](NetGroupOptions& o) { o.collective_timeout = milliseconds(800); });
  ASSERT_EQ(errors.size(), 2u);
  for (const Status& s : errors) {
    EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
    EXPECT_NE(s.message().find("rank 2 (node n2) did not reach collective"), std::string::npos)
        << s.to_string();
  }
  EXPECT_LT(seconds_since(t0), 8.0);
}

TEST(NetGroup, HungFetchServerHitsTheFetchTimeoutAndTheNextFetchWorks) {
  run_net_group(
      2, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        if (g.rank() == 1) {
          g.set_fetch_handler([](int, std::string_view req) -> Result<RankGroup::FetchReply> {
            if (req == "slow") std::this_thread::sleep_for(milliseconds(2000));
            return RankGroup::FetchReply{std::string(req), {}, nullptr};
          });
        }
        ASSERT_TRUE(g.barrier().ok());
        if (g.rank() == 0) {
          const auto t = Clock::now();
          Status s = g.fetch(1, "slow").status();
          EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
          EXPECT_NE(s.message().find("rank 1 (node n1)"), std::string::npos) << s.to_string();
          EXPECT_LT(seconds_since(t), 1.9);
          auto fast = g.fetch(1, "fast");  // on a fresh channel, once the handler is free
          ASSERT_TRUE(fast.ok()) << fast.status().to_string();
          EXPECT_EQ(*fast, "fast");
        }
        ASSERT_TRUE(g.barrier().ok());
        g.set_fetch_handler({});
      },
      [](NetGroupOptions& o) { o.timeout = milliseconds(1500); });
}

class KilledRank : public ::testing::TestWithParam<int> {};

TEST_P(KilledRank, MidCollectiveTheOthersFailAtOnceNamingIt) {
  const int victim = GetParam();
  const std::string root = free_root_address();
  ChildRank child("die-in-collective", root, victim, 3, "n" + std::to_string(victim));
  std::mutex mu;
  std::vector<std::pair<Status, double>> results;
  run_all_but(
      root, 3, victim, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        ASSERT_TRUE(g.barrier().ok());
        const auto t = Clock::now();
        Status s = g.all_gather("x").status();  // the victim dies in this one
        std::lock_guard<std::mutex> lock(mu);
        results.emplace_back(s, seconds_since(t));
        EXPECT_EQ(g.barrier(), s);  // the group stays broken
      });
  const int st = child.wait_status();
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
  ASSERT_EQ(results.size(), 2u);
  for (const auto& [s, secs] : results) {
    EXPECT_EQ(s.code(), Code::kAborted) << s.to_string();
    EXPECT_NE(s.message().find("rank " + std::to_string(victim) + " ("), std::string::npos)
        << s.to_string();
    EXPECT_NE(s.message().find("is gone"), std::string::npos) << s.to_string();
    EXPECT_LT(secs, 5.0) << s.to_string();  // 300 ms after entering, plus detection
  }
}

INSTANTIATE_TEST_SUITE_P(RootOrMember, KilledRank, ::testing::Values(0, 2));

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

TEST(KilledFetchServer, TheFetcherFailsAtOnceNamingIt) {
  const std::string root = free_root_address();
  ChildRank child("die-in-fetch", root, 1, 2, "n1");
  NetGroupOptions o = options(root, 0, 2, "n0");
  o.collective_timeout = milliseconds(60'000);
  auto g = connect_net_group(o);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE((*g)->barrier().ok());
  const auto t = Clock::now();
  std::vector<std::byte> out(1 << 20);
  Status s = (*g)->fetch_into(1, "anything", out);
  EXPECT_EQ(s.code(), Code::kAborted) << s.to_string();
  EXPECT_NE(s.message().find("rank 1 (node n1)"), std::string::npos) << s.to_string();
  EXPECT_LT(seconds_since(t), 5.0) << s.to_string();
  s = (*g)->barrier();  // the dead rank cannot join it
  EXPECT_EQ(s.code(), Code::kAborted) << s.to_string();
  EXPECT_NE(s.message().find("rank 1 (node n1)"), std::string::npos) << s.to_string();
  const int st = child.wait_status();
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
}

}  // namespace
}  // namespace ferry::checkpoint

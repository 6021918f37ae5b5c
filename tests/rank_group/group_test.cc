// The rank group on both transports (one implementation): collectives and fetches, a hung
// rank, and ranks killed mid-collective and mid-fetch, on shm ("@name") and on net (UCX on
// 127.0.0.1, token-authenticated: also a wrong token and a group serving on every interface).
//
// Ranks are threads, each with its own group. A rank that gets killed is this test binary
// re-executed (posix_spawn with FERRY_NET_GROUP_TEST_CHILD set), not a bare fork: UCX state
// of a process that already used it does not survive a fork.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>

#include "base/clock.h"
#include "rank_group/net_group_test_util.h"
#include "support/status_matchers.h"

namespace ferry::rank_group::test {
namespace {

using checkpoint::connect_net_group;

// ---- ranks in child processes ----

void run_child(const char* role) {
  const std::unique_ptr<RankGroup> g = connect_as_child_rank();
  if (std::strcmp(role, "die-in-collective") == 0) {
    // The others are in the all_gather after this barrier when this rank dies.
    if (!g->barrier().ok()) std::_Exit(3);
    std::this_thread::sleep_for(milliseconds(300));
    std::raise(SIGKILL);
  }
  if (std::strcmp(role, "die-in-fetch") == 0) {
    g->set_fetch_handler([](int, std::string_view) -> Result<RankGroup::FetchReply> {
      std::raise(SIGKILL);
      return internal_error("unreachable");
    });
    if (!g->barrier().ok()) std::_Exit(3);
    while (true) std::this_thread::sleep_for(milliseconds(100));  // until a fetch kills it
  }
  std::_Exit(4);
}

const bool kChildRan = [] {
  if (const char* role = std::getenv("FERRY_NET_GROUP_TEST_CHILD")) run_child(role);
  return false;
}();

// ---- collectives and fetches ----

// The behaviours of both groups, one body over each transport.
class Group : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(EachTransport, Group, ::testing::ValuesIn(kTransports),
                         [](const auto& p) { return p.param; });

TEST_P(Group, CollectivesAcrossNodes) {
  // 70 MiB from rank 1 is more than one control message: parts travel in chunks.
  const std::string big(70u << 20, 'x');
  std::atomic<int> done{0};
  run_group_on(
      GetParam(), 3, [](int r) { return node_of_layout(r, 3, 2); },
      [&](RankGroup& g) {
        EXPECT_EQ(g.size(), 3);
        EXPECT_EQ(g.node(), node_of_layout(g.rank(), 3, 2));
        std::string mine = "part of rank " + std::to_string(g.rank());
        if (g.rank() == 1) mine += big;
        auto all = g.all_gather(mine);
        ASSERT_OK(all);
        ASSERT_EQ(all->size(), 3u);
        EXPECT_EQ((*all)[0], "part of rank 0");
        EXPECT_EQ((*all)[1], "part of rank 1" + big);
        EXPECT_EQ((*all)[2], "part of rank 2");
        auto b = g.broadcast(g.rank() == 2 ? "from two" : "ignored", 2);
        ASSERT_OK(b);
        EXPECT_EQ(*b, "from two");
        auto empty = g.all_gather("");
        ASSERT_OK(empty);
        EXPECT_EQ(*empty, std::vector<std::string>(3));
        for (int i = 0; i < 20; ++i) ASSERT_OK(g.barrier());
        EXPECT_EQ(g.broadcast("", 3).status().code(), Code::kInvalidArgument);
        ++done;
      });
  EXPECT_EQ(done.load(), 3);
}

TEST_P(Group, FetchesAnswerFromHandlersAndCarryTheirErrors) {
  // 18 MiB and a bit that a handler lends from its own memory, as a mapped shard is lent:
  // on shm five pieces through a window of two slots, so the server waits for TAKEN.
  std::vector<std::byte> lent((18u << 20) + 4099);
  for (std::size_t i = 0; i < lent.size(); ++i) lent[i] = static_cast<std::byte>(i * 131 + 7);
  auto keep = std::make_shared<int>(0);
  // net serving on every interface: each rank is advertised as the address rank 0 saw it at.
  const auto everywhere = [](NetGroupOptions& o) { o.serve_address = "0.0.0.0:0"; };
  run_group_on(
      GetParam(), 3, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        const int me = g.rank();
        const int peer = (me + 1) % 3;
        ASSERT_EQ(g.fetch(peer, "before").status().code(), Code::kFailedPrecondition);
        ASSERT_OK(g.barrier());  // nobody asks before every rank had its no-handler answer
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
        ASSERT_OK(g.barrier());
        auto text = g.fetch(peer, "hello");
        ASSERT_OK(text);
        EXPECT_EQ(*text, "rank " + std::to_string(peer) + " answers rank " + std::to_string(me) +
                             ": hello");
        auto self = g.fetch(me, "x");
        ASSERT_OK(self);
        EXPECT_EQ(*self,
                  "rank " + std::to_string(me) + " answers rank " + std::to_string(me) + ": x");

        for (int twice = 0; twice < 2; ++twice) {  // the second through the same window
          std::vector<std::byte> into(lent.size());
          ASSERT_OK(g.fetch_into(peer, "lent", into));
          EXPECT_EQ(testing::hash_bytes(into), testing::hash_bytes(lent));
        }

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
        ASSERT_OK(again);
        EXPECT_NE(again->find(": again"), std::string::npos);
        EXPECT_EQ(g.fetch(3, "x").status().code(), Code::kInvalidArgument);
        ASSERT_OK(g.barrier());
        g.set_fetch_handler({});
      },
      milliseconds(10'000), milliseconds(20'000), everywhere);
}

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
    o.token = ::ferry::testing::kOtherTestToken;
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

TEST_P(Group, HungRankHitsTheCollectiveTimeoutAndIsNamed) {
  std::mutex mu;
  std::vector<Status> errors;
  std::atomic<int> finished{0};
  const auto t0 = Clock::now();
  run_group_on(
      GetParam(), 3, [](int r) { return "n" + std::to_string(r); },
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
      milliseconds(10'000), milliseconds(800));
  ASSERT_EQ(errors.size(), 2u);
  for (const Status& s : errors) {
    EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
    EXPECT_NE(s.message().find("rank 2 (node n2) did not reach collective"), std::string::npos)
        << s.to_string();
  }
  EXPECT_LT(seconds_since(t0), 8.0);
}

TEST_P(Group, HungFetchServerHitsTheFetchTimeoutAndTheNextFetchWorks) {
  run_group_on(
      GetParam(), 2, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        if (g.rank() == 1) {
          g.set_fetch_handler([](int, std::string_view req) -> Result<RankGroup::FetchReply> {
            if (req == "slow") std::this_thread::sleep_for(milliseconds(2000));
            return RankGroup::FetchReply{std::string(req), {}, nullptr};
          });
        }
        ASSERT_OK(g.barrier());
        if (g.rank() == 0) {
          const auto t = Clock::now();
          Status s = g.fetch(1, "slow").status();
          EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
          EXPECT_NE(s.message().find("rank 1 (node n1)"), std::string::npos) << s.to_string();
          EXPECT_LT(seconds_since(t), 1.9);
          auto fast = g.fetch(1, "fast");  // on a fresh channel, once the handler is free
          ASSERT_OK(fast);
          EXPECT_EQ(*fast, "fast");
        }
        ASSERT_OK(g.barrier());
        g.set_fetch_handler({});
      },
      milliseconds(1500));
}

// How a transport says that a peer's process ended.
std::string gone_words(const std::string& transport) {
  return transport == "shm" ? "closed the connection" : "is gone";
}

// A victim rank (0 or a member), on each transport.
class KilledRank : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(KilledRank, MidCollectiveTheOthersFailAtOnceNamingIt) {
  const auto& [victim, transport] = GetParam();
  const std::string root = root_address_for(transport);
  ChildRank child("die-in-collective", root, victim, 3, "n" + std::to_string(victim));
  std::mutex mu;
  std::vector<std::pair<Status, double>> results;
  run_all_but(
      root, 3, victim, [](int r) { return "n" + std::to_string(r); },
      [&](RankGroup& g) {
        ASSERT_OK(g.barrier());
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
    EXPECT_NE(s.message().find(gone_words(transport)), std::string::npos) << s.to_string();
    EXPECT_LT(secs, 5.0) << s.to_string();  // 300 ms after entering, plus detection
  }
}

INSTANTIATE_TEST_SUITE_P(RootOrMember, KilledRank,
                         ::testing::Combine(::testing::Values(0, 2),
                                            ::testing::ValuesIn(kTransports)),
                         [](const auto& p) {
                           return "rank" + std::to_string(std::get<0>(p.param)) + "_" +
                                  std::get<1>(p.param);
                         });

class KilledFetchServer : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledFetchServer, TheFetcherFailsAtOnceNamingIt) {
  const std::string root = root_address_for(GetParam());
  ChildRank child("die-in-fetch", root, 1, 2, "n1");
  auto g = connect_at(root, 0, 2, "n0");
  ASSERT_OK(g);
  ASSERT_OK((*g)->barrier());
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

INSTANTIATE_TEST_SUITE_P(EachTransport, KilledFetchServer, ::testing::ValuesIn(kTransports),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace ferry::rank_group::test

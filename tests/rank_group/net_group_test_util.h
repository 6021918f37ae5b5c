// Helpers for tests of the net rank group: options on 127.0.0.1 with a shared token, groups
// of threads, and ranks played by this test binary re-executed (posix_spawn with
// FERRY_NET_GROUP_TEST_CHILD=<role> set; a test binary runs the role before main()).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "ferry/rank_group.h"
#include "rank_group/group_test_util.h"
#include "support/test_support.h"

extern char** environ;

namespace ferry::rank_group::test {

using checkpoint::NetGroupOptions;
using checkpoint::RankGroup;
using std::chrono::milliseconds;

inline constexpr const char* kToken = ::ferry::testing::kTestToken;

// For rank 0 to listen on: a port below the ephemeral range (test_support.h says why).
inline std::string free_root_address() { return ferry::testing::unused_loopback_address(); }

inline NetGroupOptions options(const std::string& root, int rank, int size, std::string node) {
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
inline Connect net_connect(const std::function<void(NetGroupOptions&)>& tweak = {}) {
  return [root = free_root_address(), tweak](int rank, int size, const std::string& node) {
    NetGroupOptions o = options(root, rank, size, node);
    if (tweak) tweak(o);
    return connect_net_group(o);
  };
}

// Runs `fn(group)` for every rank of a net group on its own thread.
inline void run_net_group(int size, const std::function<std::string(int)>& node_of,
                          const std::function<void(RankGroup&)>& fn,
                          const std::function<void(NetGroupOptions&)>& tweak = {}) {
  run_group(size, node_of, fn, net_connect(tweak));
}

inline std::string node_of_layout(int rank, int ranks, int nodes) {
  return "n" + std::to_string(rank * nodes / ranks);
}

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// In a ChildRank: joins the group its environment names, collectives waiting long (the
// parent decides when the test fails); exits with 2 if it cannot join.
inline std::unique_ptr<RankGroup> connect_as_child_rank() {
  const std::string root = std::getenv("FERRY_NET_GROUP_TEST_ROOT");
  const int rank = std::atoi(std::getenv("FERRY_NET_GROUP_TEST_RANK"));
  const int size = std::atoi(std::getenv("FERRY_NET_GROUP_TEST_SIZE"));
  NetGroupOptions o = options(root, rank, size, std::getenv("FERRY_NET_GROUP_TEST_NODE"));
  o.collective_timeout = milliseconds(60'000);
  auto g = connect_net_group(o);
  if (!g.ok()) std::_Exit(2);
  return std::move(*g);
}

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
inline void run_all_but(const std::string& root, int size, int skip,
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

}  // namespace ferry::rank_group::test

// Helpers for tests of the rank group on either transport: net options on 127.0.0.1 with a
// shared token, groups of threads, and ranks played by this test binary re-executed (posix_spawn
// with FERRY_NET_GROUP_TEST_CHILD=<role> set; a test binary runs the role before main()).
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

inline std::string node_of_layout(int rank, int ranks, int nodes) {
  return "n" + std::to_string(rank * nodes / ranks);
}

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The transports a test body runs over, and a fresh root address on each: the address
// picks the group's transport ("@name": shm, the local group; "host:port": net).
inline const std::vector<std::string> kTransports = {"shm", "net"};
inline std::string root_address_for(const std::string& transport) {
  return transport == "shm" ? unique_address() : free_root_address();
}

// Joins rank `rank` of the group at `root`, on the transport the address names, with
// collectives waiting long (the test decides when it fails).
inline Result<std::unique_ptr<RankGroup>> connect_at(const std::string& root, int rank, int size,
                                                     const std::string& node) {
  if (root[0] == '@') {
    return checkpoint::connect_local_group(
        {root, rank, size, node, milliseconds(10'000), milliseconds(60'000)});
  }
  NetGroupOptions o = options(root, rank, size, node);
  o.collective_timeout = milliseconds(60'000);
  return connect_net_group(o);
}

// Runs `fn(group)` for every rank of a group on `transport` on its own thread: the join and
// fetches wait `timeout`, a collective `collective_timeout`; `tweak` changes a net rank's
// options.
inline void run_group_on(const std::string& transport, int size,
                         const std::function<std::string(int)>& node_of,
                         const std::function<void(RankGroup&)>& fn,
                         milliseconds timeout = milliseconds(10'000),
                         milliseconds collective_timeout = milliseconds(20'000),
                         const std::function<void(NetGroupOptions&)>& tweak = {}) {
  const std::string root = root_address_for(transport);
  run_group(size, node_of, fn, [=](int rank, int n, const std::string& node) {
    if (transport == "shm") {
      return checkpoint::connect_local_group({root, rank, n, node, timeout, collective_timeout});
    }
    NetGroupOptions o = options(root, rank, n, node);
    o.timeout = timeout;
    o.collective_timeout = collective_timeout;
    if (tweak) tweak(o);
    return connect_net_group(o);
  });
}

// In a ChildRank: joins the group its environment names, collectives waiting long (the
// parent decides when the test fails); exits with 2 if it cannot join.
inline std::unique_ptr<RankGroup> connect_as_child_rank() {
  auto g = connect_at(std::getenv("FERRY_NET_GROUP_TEST_ROOT"),
                      std::atoi(std::getenv("FERRY_NET_GROUP_TEST_RANK")),
                      std::atoi(std::getenv("FERRY_NET_GROUP_TEST_SIZE")),
                      std::getenv("FERRY_NET_GROUP_TEST_NODE"));
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

// Runs `fn(group)` on a thread for every rank of a group at `root` (either transport) but
// `skip`, which a child process plays. Collectives wait long: a failure must not come from a
// timeout.
inline void run_all_but(const std::string& root, int size, int skip,
                        const std::function<std::string(int)>& node_of,
                        const std::function<void(RankGroup&)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    if (r == skip) continue;
    threads.emplace_back([&, r] {
      auto g = connect_at(root, r, size, node_of(r));
      ASSERT_TRUE(g.ok()) << g.status().to_string();
      fn(**g);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace ferry::rank_group::test

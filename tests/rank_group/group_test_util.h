// Helpers for rank group tests: a fresh local root address, and the ranks of a group run
// as threads, each with its own group.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ferry/rank_group.h"

namespace ferry::rank_group::test {

using checkpoint::LocalGroupOptions;
using checkpoint::RankGroup;

inline std::string unique_address() {
  std::random_device rd;
  return "@ferry-ckpt-test-" + std::to_string(rd()) + "-" + std::to_string(rd());
}

// Joins rank `rank` of a group of `size` on `node`: one function per group, so that
// every rank it is called for joins the same group.
using Connect =
    std::function<Result<std::unique_ptr<RankGroup>>(int rank, int size, const std::string& node)>;

// Runs `fn(rank)` for every rank on its own thread, each with its own group.
// node_of(rank) names the node; fn gets the group. `connect` joins it (default: a
// local group).
inline void run_group(int size, const std::function<std::string(int)>& node_of,
                      const std::function<void(RankGroup&)>& fn, const Connect& connect = {}) {
  const std::string address = unique_address();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      LocalGroupOptions o;
      o.root_address = address;
      o.rank = r;
      o.size = size;
      o.node = node_of(r);
      o.timeout = std::chrono::milliseconds(20'000);
      auto g = connect ? connect(r, size, o.node) : checkpoint::connect_local_group(o);
      ASSERT_TRUE(g.ok()) << g.status().to_string();
      fn(**g);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace ferry::rank_group::test

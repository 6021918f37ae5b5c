// The transports the replicate tests run over, as tests/transport/conformance_test.cc runs
// its suite: net on 127.0.0.1 with an ephemeral port (nodes), shm at a fresh "@name" (two
// processes of one node). A TEST_P takes the server's address from listen_address().
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace ferry::checkpoint::test {

enum class Wire { kNet, kShm };

// Where a server of this wire listens: a new name each call, so tests never share one.
inline std::string listen_address(Wire wire) {
  static std::atomic<int> n{0};
  if (wire == Wire::kNet) return "127.0.0.1:0";
  return "@ferry-replicate-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

inline std::string wire_name(const ::testing::TestParamInfo<Wire>& info) {
  return info.param == Wire::kNet ? "Net" : "Shm";
}

#define FERRY_REPLICATE_OVER_WIRES(suite)                                            \
  INSTANTIATE_TEST_SUITE_P(Wires, suite,                                             \
                           ::testing::Values(::ferry::checkpoint::test::Wire::kNet,  \
                                             ::ferry::checkpoint::test::Wire::kShm), \
                           ::ferry::checkpoint::test::wire_name)

}  // namespace ferry::checkpoint::test

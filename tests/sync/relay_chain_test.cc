// Relays that feed relays (a chain), over the net transport on 127.0.0.1 in one process:
// the sender feeds relay 0 only, relay 0 forwards every segment to relay 1, and each
// relay's local receiver gets every byte.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <future>
#include <map>
#include <thread>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/net_test_util.h"
#include "sync/sync_test_util.h"
#include "sync/testing.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::Weights;

SyncOptions chain_options(ferry::testing::TempDir& dir) { return testing::net_options(dir); }

std::vector<TensorSpec> chain_model() {
  return {*TensorSpec::make("embed", DType::kBF16, {300, 512}),  // 300 KiB: spans buckets
          *TensorSpec::make("norm", DType::kF32, {37}),
          *TensorSpec::make("lm_head", DType::kF32, {100, 129})};
}

using Got = std::map<std::string, std::vector<std::byte>>;

// One node: a relay (serving `downstream` relays at a port of its own when > 0) and one
// local receiver that records what it got, or fails in round `fail_round` (0: never).
struct Node {
  std::thread relay;
  std::thread receiver;
  Status relay_status;
  Status receiver_status;
  Got got;
};

void start_node(Node& node, const SyncOptions& o, std::string upstream, std::uint32_t id,
                std::uint32_t downstream, int rounds, std::promise<std::string>* relays_address,
                int fail_round = 0) {
  const std::string local = testing::unique_address();
  node.relay = std::thread([&node, o, upstream, id, downstream, rounds, relays_address, local] {
    auto relay =
        Relay::connect(upstream, id, local, o, downstream > 0 ? "127.0.0.1:0" : std::string());
    if (relays_address != nullptr) {
      relays_address->set_value(relay.ok() ? (*relay)->relays_address() : std::string());
    }
    if (!relay.ok()) {
      node.relay_status = relay.status();
      return;
    }
    node.relay_status = (*relay)->accept(1, downstream);
    for (int r = 0; r < rounds && node.relay_status.ok(); ++r) {
      node.relay_status = (*relay)->relay_round().status();
    }
  });
  node.receiver = std::thread([&node, o, local, id, rounds, fail_round] {
    auto r = Receiver::connect(local, id, o);
    if (!r.ok()) {
      node.receiver_status = r.status();
      return;
    }
    for (int round = 1; round <= rounds; ++round) {
      auto s = (*r)->receive_round([&](const TensorView& t) {
        if (round == fail_round) return aborted("the test's receiver gave up");
        node.got[t.spec.name].assign(t.data.begin(), t.data.end());
        return ok_status();
      });
      node.receiver_status = s.status();
      if (!s.ok()) return;
    }
  });
}

void join(Node& node) {
  node.relay.join();
  node.receiver.join();
}

TEST(RelayChain, TwoRelaysInAChainGetEveryRoundBitExact) {
  ferry::testing::TempDir dir;
  const SyncOptions o = chain_options(dir);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  constexpr int kRounds = 3;
  Node first, second;
  std::promise<std::string> first_serves;
  auto first_address = first_serves.get_future();
  start_node(first, o, (*sender)->address(), 0, 1, kRounds, &first_serves);
  ASSERT_OK((*sender)->accept(1));  // relay 0 only: the sender's link carries each byte once
  const std::string upstream_of_second = first_address.get();
  ASSERT_FALSE(upstream_of_second.empty());
  start_node(second, o, upstream_of_second, 1, 0, kRounds, nullptr);
  Weights w;
  for (std::uint64_t round = 1; round <= kRounds; ++round) {
    w = make_weights(chain_model(), round);
    auto views = w.views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats);
    EXPECT_EQ(stats->round, round);
  }
  EXPECT_EQ((*sender)->receivers(), 1u);
  join(first);
  join(second);
  EXPECT_OK(first.relay_status);
  EXPECT_OK(second.relay_status);
  EXPECT_OK(first.receiver_status);
  EXPECT_OK(second.receiver_status);
  for (const Node* node : {&first, &second}) {
    for (std::size_t i = 0; i < w.specs.size(); ++i) {
      auto it = node->got.find(w.specs[i].name);
      ASSERT_NE(it, node->got.end()) << w.specs[i].name;
      EXPECT_TRUE(it->second == w.data[i]) << w.specs[i].name;
    }
  }
}

// A failure at the end of the chain reaches the sender through relay 0, naming relay 1, and
// the next session (without relay 1) works.
TEST(RelayChain, FailureDownTheChainIsNamedAtTheSender) {
  ferry::testing::TempDir dir;
  const SyncOptions o = chain_options(dir);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  Node first, second;
  std::promise<std::string> first_serves;
  auto first_address = first_serves.get_future();
  start_node(first, o, (*sender)->address(), 0, 1, 2, &first_serves);
  ASSERT_OK((*sender)->accept(1));
  start_node(second, o, first_address.get(), 1, 0, 2, nullptr, /*fail_round=*/2);
  Weights w = make_weights(chain_model(), 1);
  auto views = w.views();
  ASSERT_OK((*sender)->send_round(views));
  w = make_weights(chain_model(), 2);
  views = w.views();
  auto failed = (*sender)->send_round(views);
  ASSERT_FALSE(failed.ok());
  const std::string why = failed.status().to_string();
  EXPECT_NE(why.find("relay 1"), std::string::npos) << why;
  EXPECT_NE(why.find("gave up"), std::string::npos) << why;
  join(first);
  join(second);
  EXPECT_FALSE(first.relay_status.ok());
  EXPECT_NE(first.relay_status.to_string().find("relay 1"), std::string::npos)
      << first.relay_status.to_string();

  // The next session: relay 0 alone.
  Node again;
  start_node(again, o, (*sender)->address(), 0, 0, 1, nullptr);
  ASSERT_OK((*sender)->accept(1));
  w = make_weights(chain_model(), 3);
  views = w.views();
  ASSERT_OK((*sender)->send_round(views));
  join(again);
  EXPECT_OK(again.relay_status);
  EXPECT_TRUE(again.got["embed"] == w.data[0]);
}

// A byte changed after the sender hashed its bucket (here in the sender's ring; on a real
// network, in flight) is caught by the first relay, which checks every segment before it
// forwards it: the sender's error names that relay and the bucket, and its local receiver is
// told the session ended.
TEST(RelayChain, ARelayVerifiesEverySegmentBeforeForwardingIt) {
  ferry::testing::TempDir dir;
  const SyncOptions o = chain_options(dir);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  Node node;
  start_node(node, o, (*sender)->address(), 0, 0, 1, nullptr);
  ASSERT_OK((*sender)->accept(1));
  testing::ScopedCorruptSlotHook flip_a_bit([](std::uint32_t bucket, std::byte* slot) {
    if (bucket == 2) slot[17] ^= std::byte{0x01};
  });
  const Weights w = make_weights(chain_model(), 1);
  auto views = w.views();
  auto stats = (*sender)->send_round(views);
  join(node);
  ASSERT_FALSE(stats.ok());
  const std::string why = stats.status().to_string();
  EXPECT_NE(why.find("relay 0: round 1 bucket 2"), std::string::npos) << why;
  EXPECT_NE(why.find("checksum"), std::string::npos) << why;
  EXPECT_EQ(node.relay_status.code(), Code::kCorruption) << node.relay_status.to_string();
  EXPECT_FALSE(node.receiver_status.ok());
}

}  // namespace
}  // namespace ferry::sync

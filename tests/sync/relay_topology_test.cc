#include "ferry/relay_topology.h"

#include <gtest/gtest.h>

#include "support/status_matchers.h"

namespace ferry::sync {
namespace {

// Every relay but node 0 is fed by a relay of smaller index, so the sender's link carries
// each byte once and relays can be started in order.
void expect_well_formed(const std::vector<RelayPlacement>& plan) {
  ASSERT_FALSE(plan.empty());
  EXPECT_EQ(plan[0].upstream, RelayPlacement::kSender);
  std::vector<std::uint32_t> fed(plan.size(), 0);
  for (std::size_t i = 1; i < plan.size(); ++i) {
    ASSERT_GE(plan[i].upstream, 0) << "relay " << i << " is fed by the sender";
    ASSERT_LT(static_cast<std::size_t>(plan[i].upstream), i);
    ++fed[static_cast<std::size_t>(plan[i].upstream)];
    EXPECT_EQ(plan[i].depth, plan[static_cast<std::size_t>(plan[i].upstream)].depth + 1);
  }
  for (std::size_t i = 0; i < plan.size(); ++i) EXPECT_EQ(plan[i].downstream, fed[i]) << i;
}

TEST(RelayTopology, FewNodesFormAChain) {
  auto plan = relay_topology(3);
  ASSERT_OK(plan);
  expect_well_formed(*plan);
  for (std::size_t i = 1; i < plan->size(); ++i) {
    EXPECT_EQ((*plan)[i].upstream, static_cast<std::int32_t>(i - 1));
  }
  EXPECT_EQ((*plan)[2].downstream, 0u);
  EXPECT_EQ((*plan)[2].depth, 3u);
}

TEST(RelayTopology, PastTheThresholdATreeOfTheFanout) {
  RelayTopologyOptions o;
  o.max_chain_nodes = 4;
  o.fanout = 3;
  auto plan = relay_topology(13, o);
  ASSERT_OK(plan);
  expect_well_formed(*plan);
  std::uint32_t deepest = 0;
  for (const auto& p : *plan) {
    EXPECT_LE(p.downstream, 3u);
    deepest = std::max(deepest, p.depth);
  }
  EXPECT_EQ(deepest, 3u);  // 1 + 3 + 9 nodes
}

TEST(RelayTopology, ShapeCanBeForced) {
  RelayTopologyOptions o;
  o.shape = RelayShape::kTree;
  auto tree = relay_topology(3, o);
  ASSERT_OK(tree);
  EXPECT_EQ((*tree)[0].downstream, 2u);
  o.shape = RelayShape::kChain;
  auto chain = relay_topology(20, o);
  ASSERT_OK(chain);
  expect_well_formed(*chain);
  EXPECT_EQ(chain->back().depth, 20u);
}

TEST(RelayTopology, BadInputNamesTheOption) {
  auto none = relay_topology(0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("relay_nodes"), std::string::npos);
  RelayTopologyOptions o;
  o.fanout = 0;
  o.shape = RelayShape::kTree;
  auto zero = relay_topology(2, o);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("fanout"), std::string::npos);
  auto word = parse_relay_shape("ring");
  ASSERT_FALSE(word.ok());
  EXPECT_NE(word.status().message().find("ring"), std::string::npos);
  auto tree = parse_relay_shape("tree");
  ASSERT_OK(tree);
  EXPECT_EQ(*tree, RelayShape::kTree);
}

}  // namespace
}  // namespace ferry::sync

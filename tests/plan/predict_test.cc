// ferry plan's model on cases checked by hand: a star costs N links, a chain one link plus a
// segment per extra hop, the slowest stage named.
#include "plan/predict.h"

#include <gtest/gtest.h>

#include "support/status_matchers.h"

namespace ferry::plan {
namespace {

constexpr double kGB = 1e9;

// Copies so fast that only the links matter; a link of 10 GB/s (80 Gb/s, efficiency 1).
Calibration link_bound_calibration() {
  Calibration c = default_calibration();
  c.shm_round_gbps = 1e6;
  c.two_threads_gbps = 1e6;
  c.net_round_gbps = 1;
  c.net_limit_gbps = 1;
  return c;
}

ClusterSpec ten_gb_model(std::uint32_t nodes, Topology topology) {
  ClusterSpec c;
  c.nodes = nodes;
  c.nic_gbps = 80;
  c.model_bytes = static_cast<std::uint64_t>(10 * kGB);
  c.topology = topology;
  return c;
}

const Stage* find_stage(const Prediction& p, const std::string& name) {
  for (const Stage& s : p.stages) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

TEST(Predict, StarCostsOneLinkPerNode) {
  const Calibration cal = link_bound_calibration();
  for (std::uint32_t nodes : {1u, 2u, 4u, 8u}) {
    auto p = predict(ten_gb_model(nodes, Topology::kStar), cal);
    ASSERT_OK(p);
    // 10 GB at 10 GB/s per node, the sender's link carries every node's copy.
    EXPECT_NEAR(p->seconds, nodes * 1.0, 0.01) << nodes << " nodes";
    EXPECT_EQ(p->bottleneck, "sender_link");
    EXPECT_EQ(p->depth, 1u);
    EXPECT_EQ(find_stage(*p, "relay_forward"), nullptr) << "a star's relays forward nothing";
  }
}

TEST(Predict, ChainCostsOneLinkPlusOneSegmentPerExtraHop) {
  const Calibration cal = link_bound_calibration();
  const double segment_seconds = static_cast<double>(kSegmentBytes) / (10 * kGB);
  for (std::uint32_t nodes : {1u, 2u, 4u, 16u}) {
    auto p = predict(ten_gb_model(nodes, Topology::kChain), cal);
    ASSERT_OK(p);
    EXPECT_NEAR(p->seconds, 1.0 + (nodes - 1) * segment_seconds, 0.002) << nodes << " nodes";
    EXPECT_EQ(p->depth, nodes);
    const Stage* link = find_stage(*p, "sender_link");
    ASSERT_NE(link, nullptr);
    EXPECT_EQ(link->bytes, ten_gb_model(nodes, Topology::kChain).model_bytes)
        << "the sender's link carries the model once whatever the node count";
  }
}

TEST(Predict, TreeSenderAndRelaysCarryFanoutCopies) {
  ClusterSpec c = ten_gb_model(6, Topology::kTree);
  c.fanout = 2;  // sender -> 1, 2; 1 -> 3, 4; 2 -> 5, 6
  auto p = predict(c, link_bound_calibration());
  ASSERT_OK(p);
  EXPECT_EQ(p->depth, 2u);
  EXPECT_EQ(find_stage(*p, "sender_link")->bytes, 2 * c.model_bytes);
  EXPECT_EQ(find_stage(*p, "relay_forward")->bytes, 2 * c.model_bytes);
  EXPECT_NEAR(p->seconds, 2.0 + 2 * static_cast<double>(kSegmentBytes) / (10 * kGB), 0.002);
}

TEST(Predict, NamesTheSlowestStage) {
  Calibration cal = link_bound_calibration();
  cal.shm_round_gbps = 2;  // one core packs and copies at 2 GB/s: 5 s against a 1 s link
  ClusterSpec c = ten_gb_model(1, Topology::kStar);
  auto p = predict(c, cal);
  ASSERT_OK(p);
  EXPECT_EQ(p->bottleneck, "sender_pack");
  EXPECT_GE(p->seconds, 5.0);
  c.senders = 10;  // each packs a tenth: 0.5 s; the receiver's copy of all 10 GB is left
  p = predict(c, cal);
  ASSERT_OK(p);
  EXPECT_EQ(p->bottleneck, "receiver_copy");
  c.shard_ways = 1;
  c.h2d_gbps = 0.5;  // 20 s to the device
  p = predict(c, cal);
  ASSERT_OK(p);
  EXPECT_EQ(p->bottleneck, "device_h2d");
  EXPECT_NEAR(find_stage(*p, "device_h2d")->seconds, 20.0, 1e-9);
}

TEST(Predict, ShardsShrinkWhatEachReceiverAndNodeNeeds) {
  ClusterSpec c = ten_gb_model(2, Topology::kStar);
  c.gpus_per_node = 4;
  c.shard_ways = 8;  // one replica over both nodes: each node needs half the model
  auto p = predict(c, link_bound_calibration());
  ASSERT_OK(p);
  EXPECT_EQ(find_stage(*p, "sender_link")->bytes, c.model_bytes);  // two halves
  EXPECT_EQ(find_stage(*p, "receiver_copy")->bytes, c.model_bytes / 8);
}

// Senders spread over nodes of their own: each sender node's NICs carry its senders' parts,
// so S one-NIC nodes are S NICs' worth on the sender's side, and the busiest node (the one
// with the most senders) is the sender's link.
TEST(Predict, SenderNodesEachSendTheirSendersParts) {
  const Calibration cal = link_bound_calibration();
  ClusterSpec c = ten_gb_model(4, Topology::kStar);
  c.senders = 2;
  c.sender_nodes = 2;
  auto spread = predict(c, cal);
  ASSERT_OK(spread);
  // 4 nodes x 10 GB over two senders' nodes of 10 GB/s each: 20 GB and 2 s apiece.
  EXPECT_EQ(find_stage(*spread, "sender_link")->bytes, 2 * c.model_bytes);
  EXPECT_NEAR(spread->seconds, 2.0, 0.01);
  EXPECT_EQ(spread->bottleneck, "sender_link");
  // The same as one node with both senders' NICs (the stand-in before --sender-nodes).
  c.sender_nodes = 1;
  c.nics_per_node = 2;
  auto one_node = predict(c, cal);
  ASSERT_OK(one_node);
  EXPECT_NEAR(one_node->seconds, spread->seconds, 1e-9);
  EXPECT_EQ(find_stage(*one_node, "node_inbound"), nullptr) << "one sending node: no stage";
  // 3 senders over 2 nodes: the busiest node sends 2 of the 3 parts.
  c.nics_per_node = 1;
  c.senders = 3;
  c.sender_nodes = 2;
  auto uneven = predict(c, cal);
  ASSERT_OK(uneven);
  EXPECT_NEAR(static_cast<double>(find_stage(*uneven, "sender_link")->bytes),
              4 * c.model_bytes * 2.0 / 3, 1.0);
}

// From several sending nodes a node takes its bytes from all of them at once: past as many
// sender nodes as receiving nodes (a star), the receiving node's inbound link bounds it.
TEST(Predict, ManySenderNodesAreBoundByANodesInboundLink) {
  ClusterSpec c = ten_gb_model(1, Topology::kStar);
  c.senders = 4;
  c.sender_nodes = 4;
  auto p = predict(c, link_bound_calibration());
  ASSERT_OK(p);
  EXPECT_EQ(find_stage(*p, "sender_link")->bytes, c.model_bytes / 4);
  EXPECT_EQ(find_stage(*p, "node_inbound")->bytes, c.model_bytes);
  EXPECT_EQ(p->bottleneck, "node_inbound");
  EXPECT_NEAR(p->seconds, 1.0, 0.01);  // 10 GB through one 10 GB/s node, not 2.5 GB per node
  // A chain's first node takes the model once from the senders, whatever the node count.
  c = ten_gb_model(8, Topology::kChain);
  c.senders = 2;
  c.sender_nodes = 2;
  p = predict(c, link_bound_calibration());
  ASSERT_OK(p);
  EXPECT_EQ(find_stage(*p, "node_inbound")->bytes, c.model_bytes);
  EXPECT_EQ(find_stage(*p, "sender_link")->bytes, c.model_bytes / 2);
}

TEST(Predict, DeltaScalesTheWireOnly) {
  ClusterSpec c = ten_gb_model(1, Topology::kStar);
  c.delta_density = 0.01;
  const Calibration cal = link_bound_calibration();
  auto p = predict(c, cal);
  ASSERT_OK(p);
  EXPECT_DOUBLE_EQ(p->wire_ratio, delta_ratio(cal, 0.01));
  EXPECT_EQ(find_stage(*p, "sender_link")->bytes,
            static_cast<std::uint64_t>(c.model_bytes * p->wire_ratio + 0.5));
  EXPECT_EQ(find_stage(*p, "sender_pack")->bytes, c.model_bytes);
}

TEST(Predict, SharedHostAddsEveryNodesWork) {
  Calibration cal = default_calibration();
  cal.shm_round_gbps = 10;  // pack: 1 s for 10 GB
  cal.net_round_gbps = 2;   // one node's round: 5 s, of which 4 s beyond packing
  ClusterSpec c = ten_gb_model(1, Topology::kStar);
  c.shared_host = true;
  c.nic_gbps = 0;  // not used on a shared host
  for (std::uint32_t nodes : {1u, 2u, 4u}) {
    c.nodes = nodes;
    auto p = predict(c, cal);
    ASSERT_OK(p);
    EXPECT_NEAR(p->seconds, 1.0 + 4.0 * nodes, 1e-6) << nodes << " nodes";
  }
}

// With the calibrated CPU split, the one-node round (5 s here) divides as the CPU seconds
// do: a fifth is the sender's whatever the node count, the rest repeats per node.
TEST(Predict, SharedHostSplitsTheRoundAsTheCalibratedCpuSeconds) {
  Calibration cal = default_calibration();
  cal.shm_round_gbps = 10;
  cal.net_round_gbps = 2;
  cal.net_cpu_fixed_s = 0.5;
  cal.net_cpu_per_node_s = 2.0;
  ClusterSpec c = ten_gb_model(1, Topology::kStar);
  c.shared_host = true;
  c.nic_gbps = 0;
  for (std::uint32_t nodes : {1u, 2u, 4u}) {
    c.nodes = nodes;
    auto p = predict(c, cal);
    ASSERT_OK(p);
    EXPECT_NEAR(p->seconds, 1.0 + 4.0 * nodes, 1e-6) << nodes << " nodes";
  }
  cal.net_cpu_fixed_s = 2.0;  // a heavier sender: each node adds less of the round
  cal.net_cpu_per_node_s = 0.5;
  c.nodes = 4;
  auto p = predict(c, cal);
  ASSERT_OK(p);
  EXPECT_NEAR(p->seconds, 4.0 + 1.0 * 4, 1e-6);
}

// On one machine several senders share the cores: between them they pack the whole model,
// so a second sender does not halve the packing as it does on a cluster (measured in
// tests/netns/plan_netns_validate.sh, RATE_MBIT=0: 2 senders no faster than 1).
TEST(Predict, SharedHostSendersPackTheWholeModelBetweenThem) {
  Calibration cal = default_calibration();
  cal.shm_round_gbps = 10;
  cal.net_round_gbps = 2;
  ClusterSpec c = ten_gb_model(4, Topology::kStar);
  c.shared_host = true;
  c.nic_gbps = 0;
  auto one = predict(c, cal);
  ASSERT_OK(one);
  c.senders = 2;
  auto two = predict(c, cal);
  ASSERT_OK(two);
  EXPECT_NEAR(two->seconds, one->seconds, 1e-9);
  EXPECT_EQ(find_stage(*two, "sender_pack")->bytes, c.model_bytes);
}

TEST(Predict, RefusesClustersItCannotModelNamingTheOption) {
  const Calibration cal = default_calibration();
  auto expect_refused = [&](ClusterSpec c, const std::string& option) {
    auto p = predict(c, cal);
    ASSERT_FALSE(p.ok()) << option;
    EXPECT_EQ(p.status().code(), Code::kInvalidArgument);
    EXPECT_NE(p.status().message().find(option), std::string::npos) << p.status().message();
  };
  ClusterSpec c = ten_gb_model(2, Topology::kStar);
  ClusterSpec bad = c;
  bad.nodes = 0;
  expect_refused(bad, "--nodes");
  bad = c;
  bad.nic_gbps = 0;
  expect_refused(bad, "--nic-gbps");
  bad = c;
  bad.shard_ways = 3;  // more than 2 nodes x 1 GPU
  expect_refused(bad, "--shard-ways");
  bad = c;
  bad.topology = Topology::kTree;
  bad.fanout = 0;
  expect_refused(bad, "--fanout");
  bad = c;
  bad.delta_density = 1.5;
  expect_refused(bad, "--delta-density");
  bad = c;
  bad.sender_nodes = 0;
  expect_refused(bad, "--sender-nodes");
  bad = c;
  bad.senders = 2;
  bad.sender_nodes = 3;  // more nodes than senders
  expect_refused(bad, "--sender-nodes");
}

TEST(Topology, ParsesNamesAndRefusesOthers) {
  ASSERT_OK(parse_topology("chain"));
  EXPECT_EQ(*parse_topology("tree"), Topology::kTree);
  auto bad = parse_topology("ring");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ring"), std::string::npos);
  EXPECT_EQ(feeding_nodes(Topology::kTree, 6, 2), (std::vector<std::uint32_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(feeding_nodes(Topology::kChain, 3, 2), (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_EQ(feeding_nodes(Topology::kStar, 3, 2), (std::vector<std::uint32_t>{0, 0, 0}));
}

}  // namespace
}  // namespace ferry::plan

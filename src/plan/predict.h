// `ferry plan`: one weight update's time on a cluster, from this machine's calibrated rates.
//
// The update flows through stages in 16 MiB segments (docs/protocol.md, "Segments"): the
// sender packs, its link sends, relays forward, each node's receivers copy out of the ring,
// then (optionally) to the device. Stages overlap, so the update takes its slowest stage's
// time plus one segment's time in every other stage on the deepest path (pipeline fill).
// docs/plan.md has the model, its assumptions and its validation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "plan/calibration.h"
#include "plan/topology.h"

namespace ferry::plan {

inline constexpr std::uint64_t kSegmentBytes = std::uint64_t{16} << 20;

// A cluster. Field names are the `ferry plan` options (nic_gbps is --nic-gbps).
struct ClusterSpec {
  std::uint32_t nodes = 1;          // receiving (rollout) nodes, one relay each
  std::uint32_t gpus_per_node = 1;  // local receivers (ranks) per node
  std::uint32_t nics_per_node = 1;  // every node's (and the sender's) NICs, used together
  double nic_gbps = 0;              // line rate of one NIC, Gb/s (10^9 bits per second)
  std::uint64_t model_bytes = 0;    // one full update, dense
  // GPUs one rollout replica spans (TP x EP ...): a receiver needs model_bytes / shard_ways.
  std::uint32_t shard_ways = 1;
  // Trainer ranks sending disjoint parts, each over its own session (sync::MultiReceiver
  // takes the union), spread evenly over sender_nodes nodes of nics_per_node NICs each.
  std::uint32_t senders = 1;
  std::uint32_t sender_nodes = 1;
  Topology topology = Topology::kStar;
  std::uint32_t fanout = 2;  // children per node, tree only
  std::uint64_t bucket_bytes = std::uint64_t{512} << 20;
  std::optional<double> delta_density;  // changed elements' share, (0, 1]; none: dense
  double host_mem_gbps = 0;  // a node's memory copy rate, all cores; 0: the calibration's
  double h2d_gbps = 0;       // host to device per GPU, GB/s; 0: not modelled
  // Every node is a namespace or process on this one machine (validation here): the nodes
  // share its cores, so their work adds up instead of overlapping, and NICs do not apply.
  bool shared_host = false;
};

struct Stage {
  std::string name;
  double seconds = 0;              // the whole update through this stage
  std::uint64_t bytes = 0;         // what it moves (per sender, link, relay or receiver)
  std::uint64_t stream_bytes = 0;  // one stream's bytes: a segment is segment/stream of it
  std::string what;                // one line: what the stage is and its rate
};

struct Prediction {
  double seconds = 0;
  std::string bottleneck;  // the slowest stage's name
  std::vector<Stage> stages;
  std::uint32_t depth = 0;  // relay hops from the sender to the farthest node
  double wire_ratio = 1;    // bytes on the wire / dense bytes (delta)
  double link_gbps = 0;     // GB/s one node's NICs carry in a ferry round
  std::uint64_t segment_bytes = 0;
  std::vector<std::string> notes;  // assumptions the figure rests on
};

// invalid_argument naming the field (as its option) for a cluster it cannot model.
Result<Prediction> predict(const ClusterSpec& cluster, const Calibration& calibration);

}  // namespace ferry::plan

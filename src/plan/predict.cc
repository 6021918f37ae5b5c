#include "plan/predict.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "base/status_macros.h"

namespace ferry::plan {
namespace {

constexpr double kGB = 1e9;

std::string rate_text(double gbps) {
  std::ostringstream s;
  s.precision(3);
  s << gbps << " GB/s";
  return s.str();
}

Status check_cluster(const ClusterSpec& c) {
  auto bad = [](const char* field, const std::string& why) {
    std::string option = field;
    std::replace(option.begin(), option.end(), '_', '-');
    return invalid_argument(std::string(field) + " (--" + option + ") " + why);
  };
  if (c.nodes == 0) return bad("nodes", "must be at least 1");
  if (c.gpus_per_node == 0) return bad("gpus_per_node", "must be at least 1");
  if (c.nics_per_node == 0) return bad("nics_per_node", "must be at least 1");
  if (!c.shared_host && !(c.nic_gbps > 0)) return bad("nic_gbps", "must be > 0 Gb/s");
  if (c.model_bytes == 0) return bad("model_bytes", "must be > 0 (give --preset or --params)");
  if (c.shard_ways == 0 || c.shard_ways > std::uint64_t{c.nodes} * c.gpus_per_node) {
    return bad("shard_ways", "must be in 1..nodes x gpus_per_node");
  }
  if (c.senders == 0) return bad("senders", "must be at least 1");
  if (c.sender_nodes == 0 || c.sender_nodes > c.senders) {
    return bad("sender_nodes", "must be in 1..senders");
  }
  if (c.topology == Topology::kTree && c.fanout == 0) return bad("fanout", "must be at least 1");
  if (c.bucket_bytes == 0) return bad("bucket_bytes", "must be > 0");
  if (c.delta_density && !(*c.delta_density > 0 && *c.delta_density <= 1)) {
    return bad("delta_density", "must be in (0, 1]");
  }
  if (c.host_mem_gbps < 0 || std::isnan(c.host_mem_gbps)) {
    return bad("host_mem_gbps", "must be >= 0 GB/s");
  }
  if (c.h2d_gbps < 0 || std::isnan(c.h2d_gbps)) return bad("h2d_gbps", "must be >= 0 GB/s");
  return ok_status();
}

std::uint64_t scaled(std::uint64_t bytes, double ratio) {
  return static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes) * ratio));
}

double fill_seconds(const Stage& s, std::uint64_t segment) {
  if (s.stream_bytes == 0) return 0;
  return s.seconds * std::min(1.0, static_cast<double>(segment) / s.stream_bytes);
}

// Nodes on this machine: the cores are shared, so each node's work adds to the round. With
// the calibration's CPU split, the one-node round divides into what the sender spends
// whatever the node count and what each node adds (as the CPU seconds do), and N nodes take
// the fixed part once and the per-node part N times: the cores are assumed as busy as in the
// calibrated round. Without it, every node costs a whole round beyond the sender's packing.
// Several senders run on the same cores too: between them they pack the whole model, so
// their packing adds up as the nodes' work does (each node's bytes are the same whichever
// sender's part they are).
Prediction predict_shared_host(const ClusterSpec& c, const Calibration& cal, Prediction p,
                               std::uint64_t node_bytes) {
  const std::uint64_t pack_bytes = c.model_bytes;
  const std::uint64_t node_wire = scaled(node_bytes, p.wire_ratio);
  const double round_per_byte = 1 / (cal.net_round_gbps * kGB);  // one node, whole round
  double fixed_per_byte = 1 / (cal.shm_round_gbps * kGB);
  std::string fixed_what = "sender copies into its ring at " + rate_text(cal.shm_round_gbps);
  if (cal.net_cpu_fixed_s > 0 && cal.net_cpu_per_node_s > 0) {
    const double fixed_share = cal.net_cpu_fixed_s / (cal.net_cpu_fixed_s + cal.net_cpu_per_node_s);
    fixed_per_byte = round_per_byte * fixed_share;
    fixed_what = "the sender's work whatever the node count (" +
                 std::to_string(static_cast<int>(fixed_share * 100 + 0.5)) +
                 "% of the calibrated round's CPU)";
  }
  const double node_per_byte = std::max(0.0, round_per_byte - fixed_per_byte);
  if (c.senders > 1) fixed_what += ", " + std::to_string(c.senders) + " senders one after another";
  p.stages.push_back(
      {"sender_pack", pack_bytes * fixed_per_byte, pack_bytes, pack_bytes, fixed_what});
  p.stages.push_back(
      {"nodes_on_shared_cpu", c.nodes * (node_wire * node_per_byte), c.nodes * node_wire, node_wire,
       "each node's wire, relay and receiver work on the shared cores, one after another"});
  p.seconds = p.stages[0].seconds + p.stages[1].seconds;
  p.bottleneck = p.stages[1].seconds >= p.stages[0].seconds ? "nodes_on_shared_cpu" : "sender_pack";
  p.notes.push_back(
      "shared host: every node runs on this machine's cores, so node work adds up; the "
      "topology does not change it (every byte still crosses one TCP stream per node)");
  return p;
}

}  // namespace

Result<Prediction> predict(const ClusterSpec& c, const Calibration& cal) {
  FERRY_RETURN_IF_ERROR(check_cluster(c));
  FERRY_RETURN_IF_ERROR(validate(cal));
  Prediction p;
  p.segment_bytes = std::min(kSegmentBytes, c.bucket_bytes);  // a segment never spans buckets
  p.wire_ratio = c.delta_density ? delta_ratio(cal, *c.delta_density) : 1.0;
  if (c.delta_density) {
    p.notes.push_back("delta: bytes on the wire x" + std::to_string(p.wire_ratio) +
                      " (calibration table); encode and apply time not modelled");
  }
  const std::uint64_t model = c.model_bytes;
  const std::uint64_t receiver_bytes = model / c.shard_ways;
  // A node holds gpus_per_node receivers' shares, at most the whole model.
  const std::uint64_t node_bytes = std::min<std::uint64_t>(model, receiver_bytes * c.gpus_per_node);
  if (c.shared_host) return predict_shared_host(c, cal, std::move(p), node_bytes);

  // Per node, the bytes its subtree needs (dense; at most the model), then on the wire.
  const std::vector<std::uint32_t> feeder = feeding_nodes(c.topology, c.nodes, c.fanout);
  std::vector<std::uint64_t> subtree(c.nodes + 1, 1);
  std::vector<std::uint32_t> depth(c.nodes + 1, 0);
  for (std::uint32_t node = c.nodes; node >= 1; --node) subtree[feeder[node - 1]] += subtree[node];
  std::vector<std::uint64_t> out_bytes(c.nodes + 1, 0);  // what each node (0: senders) sends
  std::uint64_t from_senders = 0;                        // the most one node takes from the senders
  for (std::uint32_t node = 1; node <= c.nodes; ++node) {
    depth[node] = depth[feeder[node - 1]] + 1;
    const std::uint64_t needed = std::min<std::uint64_t>(model, subtree[node] * node_bytes);
    out_bytes[feeder[node - 1]] += scaled(needed, p.wire_ratio);
    if (feeder[node - 1] == 0) from_senders = std::max(from_senders, scaled(needed, p.wire_ratio));
  }
  // Each sender sends 1/senders of every child's bytes; a sender node sends its senders'
  // parts (the busiest holds ceil(senders / sender_nodes) of them).
  const std::uint32_t senders_per_node = (c.senders + c.sender_nodes - 1) / c.sender_nodes;
  const std::uint64_t sender_node_out = static_cast<std::uint64_t>(
      std::llround(static_cast<double>(out_bytes[0]) * senders_per_node / c.senders));
  p.depth = *std::max_element(depth.begin(), depth.end());
  const std::uint64_t relay_out = *std::max_element(out_bytes.begin() + 1, out_bytes.end());
  const std::uint64_t stream = scaled(node_bytes, p.wire_ratio);

  p.link_gbps = c.nics_per_node * c.nic_gbps / 8 * cal.net_efficiency();
  const double link_rate = p.link_gbps * kGB;
  const double copy_rate = cal.shm_round_gbps * kGB;
  const double mem_gbps = c.host_mem_gbps > 0 ? c.host_mem_gbps : cal.two_threads_gbps;
  const std::uint64_t pack_bytes = model / c.senders;
  const std::uint64_t fanout_bytes = receiver_bytes * c.gpus_per_node;

  // The path of one segment, in order; relay_forward repeats once per hop past the first.
  p.stages.push_back({"sender_pack", pack_bytes / copy_rate, pack_bytes, pack_bytes,
                      "each of " + std::to_string(c.senders) +
                          " sender(s) packs its share into its ring, one core at " +
                          rate_text(cal.shm_round_gbps)});
  p.stages.push_back({"sender_link", sender_node_out / link_rate, sender_node_out, stream,
                      c.sender_nodes == 1
                          ? "the sender node's NICs at " + rate_text(p.link_gbps)
                          : "the busiest of " + std::to_string(c.sender_nodes) +
                                " sender nodes' NICs (" + std::to_string(senders_per_node) +
                                " sender(s)' parts) at " + rate_text(p.link_gbps)});
  // From one sending node a node's inbound link carries no more than the sender's outbound
  // one; from several, it takes its bytes from all of them at once and can bound the round.
  if (c.sender_nodes > 1) {
    p.stages.push_back({"node_inbound", from_senders / link_rate, from_senders, stream,
                        "a node's NICs take its bytes from " + std::to_string(c.sender_nodes) +
                            " sender nodes at " + rate_text(p.link_gbps)});
  }
  if (relay_out > 0) {
    p.stages.push_back({"relay_forward", relay_out / link_rate, relay_out, stream,
                        "the busiest relay sends downstream at " + rate_text(p.link_gbps)});
  }
  p.stages.push_back({"local_fanout", fanout_bytes / (mem_gbps * kGB), fanout_bytes, receiver_bytes,
                      std::to_string(c.gpus_per_node) +
                          " local receivers copy out of the ring together, host memory at " +
                          rate_text(mem_gbps)});
  p.stages.push_back(
      {"receiver_copy", receiver_bytes / copy_rate, receiver_bytes, receiver_bytes,
       "one receiver copies its share, one core at " + rate_text(cal.shm_round_gbps)});
  if (c.h2d_gbps > 0) {
    p.stages.push_back({"device_h2d", receiver_bytes / (c.h2d_gbps * kGB), receiver_bytes,
                        receiver_bytes, "host to device per GPU at " + rate_text(c.h2d_gbps)});
  }

  const auto slowest =
      std::max_element(p.stages.begin(), p.stages.end(),
                       [](const Stage& a, const Stage& b) { return a.seconds < b.seconds; });
  p.bottleneck = slowest->name;
  // Fill: one segment through every other stage on the path. The receiver's copy and the
  // node's fan-out are the same copy seen per core and per node: count the larger once. A
  // node's inbound link is the far end of the senders' links: a segment crosses both at once.
  double fill = 0;
  double copy_fill = 0;
  for (const Stage& s : p.stages) {
    if (s.name == "node_inbound") continue;
    const double f = fill_seconds(s, p.segment_bytes);
    if (s.name == "local_fanout" || s.name == "receiver_copy") {
      copy_fill = std::max(copy_fill, f);
    } else if (s.name == "relay_forward") {
      fill += f * (p.depth - 1);
    } else {
      fill += f;
    }
  }
  fill += copy_fill;
  // The slowest stage runs whole, not for one segment.
  double slowest_fill = fill_seconds(*slowest, p.segment_bytes);
  if (slowest->name == "local_fanout" || slowest->name == "receiver_copy") {
    slowest_fill = copy_fill;
  } else if (slowest->name == "node_inbound") {
    slowest_fill = 0;
  }
  p.seconds = slowest->seconds + fill - slowest_fill;
  if (c.senders > 1) {
    p.notes.push_back(
        "several senders: each rank sends a disjoint part over its own session and receivers "
        "take the union (sync::MultiReceiver, `ferry sync serve --part`)");
    if (c.shard_ways > 1) {
      p.notes.push_back(
          "rank-local slices are built for one sender (`ferry sync recv --tp`); a receiver of "
          "several senders' parts still takes whole tensors (predict it with --shard-ways 1)");
    }
  }
  return p;
}

}  // namespace ferry::plan

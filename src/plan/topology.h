// How relay nodes are arranged in `ferry plan`'s model: who feeds whom. Independent of
// sync's own topology code, so the plan can model layouts before they are built.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::plan {

enum class Topology {
  kStar,   // the sender sends every node its bytes itself (what sync builds today)
  kChain,  // the sender feeds node 1, node i forwards to node i + 1
  kTree,   // the sender feeds `fanout` roots, each node forwards to `fanout` children
};

// "star", "chain" or "tree"; anything else is invalid_argument naming it.
Result<Topology> parse_topology(std::string_view text);
std::string_view topology_name(Topology t);

// parents[i] is the node that feeds node i + 1 (nodes are 1..nodes, 0 is the sender), as a
// heap of `fanout` children per node: a star has fanout = nodes, a chain fanout = 1.
std::vector<std::uint32_t> feeding_nodes(Topology t, std::uint32_t nodes, std::uint32_t fanout);

}  // namespace ferry::plan

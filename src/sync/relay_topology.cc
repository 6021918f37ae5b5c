#include "ferry/relay_topology.h"

#include <fmt/format.h>

namespace ferry::sync {

Result<std::vector<RelayPlacement>> relay_topology(std::uint32_t relay_nodes,
                                                   const RelayTopologyOptions& options) {
  if (relay_nodes == 0) return invalid_argument("relay_topology: relay_nodes must be at least 1");
  if (options.fanout == 0) return invalid_argument("relay_topology: fanout must be at least 1");
  const bool chain = options.shape == RelayShape::kChain ||
                     (options.shape == RelayShape::kAuto && relay_nodes <= options.max_chain_nodes);
  // A chain is the tree of fan-out 1.
  const std::uint32_t k = chain ? 1 : options.fanout;
  std::vector<RelayPlacement> plan(relay_nodes);
  for (std::uint32_t i = 1; i < relay_nodes; ++i) {
    const std::uint32_t parent = (i - 1) / k;
    plan[i].upstream = static_cast<std::int32_t>(parent);
    plan[i].depth = plan[parent].depth + 1;
    ++plan[parent].downstream;
  }
  return plan;
}

const char* relay_shape_name(RelayShape shape) {
  switch (shape) {
    case RelayShape::kChain:
      return "chain";
    case RelayShape::kTree:
      return "tree";
    case RelayShape::kAuto:
      break;
  }
  return "auto";
}

Result<RelayShape> parse_relay_shape(const std::string& name) {
  for (RelayShape s : {RelayShape::kAuto, RelayShape::kChain, RelayShape::kTree}) {
    if (name == relay_shape_name(s)) return s;
  }
  return invalid_argument(fmt::format("relay shape '{}' is not one of auto, chain, tree", name));
}

}  // namespace ferry::sync

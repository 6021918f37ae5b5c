#include "plan/topology.h"

#include <string>

namespace ferry::plan {

Result<Topology> parse_topology(std::string_view text) {
  if (text == "star") return Topology::kStar;
  if (text == "chain") return Topology::kChain;
  if (text == "tree") return Topology::kTree;
  return invalid_argument("unknown topology '" + std::string(text) + "' (star, chain or tree)");
}

std::string_view topology_name(Topology t) {
  switch (t) {
    case Topology::kStar:
      return "star";
    case Topology::kChain:
      return "chain";
    case Topology::kTree:
      return "tree";
  }
  return "?";
}

std::vector<std::uint32_t> feeding_nodes(Topology t, std::uint32_t nodes, std::uint32_t fanout) {
  const std::uint32_t children = t == Topology::kStar ? nodes : t == Topology::kChain ? 1 : fanout;
  std::vector<std::uint32_t> parents(nodes);
  for (std::uint32_t node = 1; node <= nodes; ++node) parents[node - 1] = (node - 1) / children;
  return parents;
}

}  // namespace ferry::plan

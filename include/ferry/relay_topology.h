// Which relay feeds which, when many nodes receive the same rounds. The sender feeds one relay
// (node 0); every other relay is fed by a relay, so the sender's link carries each byte once
// whatever the node count. A relay forwards each segment downstream as soon as it has it, so a
// round costs about one node's time plus one segment's time per hop.
//
//   auto plan = ferry::sync::relay_topology(4, {});  // chain: sender -> 0 -> 1 -> 2 -> 3
//   (*plan)[2].upstream == 1, (*plan)[2].downstream == 1
//
// A chain has the fewest copies per relay (each uplink carries every byte once) but its depth
// grows with the node count; a tree of fan-out k has depth log_k(nodes) but each relay's uplink
// carries every byte k times. ferry picks a chain for few nodes and a tree past a threshold.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"

namespace ferry::sync {

enum class RelayShape : std::uint8_t {
  kAuto,   // a chain up to RelayTopologyOptions::max_chain_nodes, else a tree
  kChain,  // sender -> 0 -> 1 -> ... -> n-1
  kTree,   // breadth first: relay i feeds relays fanout*i+1 .. fanout*i+fanout
};

struct RelayTopologyOptions {
  RelayShape shape = RelayShape::kAuto;
  // kAuto: the most relay nodes served as a chain. Each hop adds one segment's time (16 MiB)
  // and one relay that, if it dies, aborts the round for all behind it; 8 keeps both small.
  std::uint32_t max_chain_nodes = 8;
  // kTree (and kAuto past max_chain_nodes): relays each relay feeds. Raising it makes the tree
  // shallower but multiplies the bytes on each relay's uplink. Must be at least 1.
  std::uint32_t fanout = 2;
};

// Where one relay node sits: who feeds it and how many relays it feeds.
struct RelayPlacement {
  static constexpr std::int32_t kSender = -1;
  std::int32_t upstream = kSender;  // kSender, or the index of the relay that feeds this one
  std::uint32_t downstream = 0;     // relays this one feeds (its --downstream count)
  std::uint32_t depth = 1;          // hops from the sender: 1 for the relay the sender feeds
};

// Per relay node (index 0 .. relay_nodes-1), its place. Node 0 is always fed by the sender and
// every relay's upstream has a smaller index, so relays may be started in index order.
// Errors: kInvalidArgument for relay_nodes == 0 or fanout == 0, naming the option.
FERRY_EXPORT Result<std::vector<RelayPlacement>> relay_topology(
    std::uint32_t relay_nodes, const RelayTopologyOptions& options = {});

// "chain" / "tree" / "auto", and the reverse (kInvalidArgument naming the word).
FERRY_EXPORT const char* relay_shape_name(RelayShape shape);
FERRY_EXPORT Result<RelayShape> parse_relay_shape(const std::string& name);

}  // namespace ferry::sync

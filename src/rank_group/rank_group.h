// The rank groups: how the ranks of a collective save or load find each other, run
// collectives and fetch from each other. The one header of this module other modules
// include. The interface (RankGroup) and the two ways to join one (connect_local_group,
// connect_net_group) are public, in ferry/checkpoint.h; their protocols are specified in
// docs/protocol.md ("Rank groups") and their limits in rank_group/constants.h.
#pragma once

#include <string_view>

#include "ferry/rank_group.h"
#include "ferry/status.h"

namespace ferry::rank_group {

// A node name is one path component of [A-Za-z0-9._-], 1-128 characters, not "." or "..":
// ranks with the same name share a checkpoint root, whose folders are named after it.
Status validate_node_name(std::string_view node);

}  // namespace ferry::rank_group

// The shm transport's entry in the registry (transport/registry.h).
#pragma once

#include <memory>

#include "ferry/status.h"
#include "transport/transport.h"

namespace ferry::shm {

// Processes on this node, over a UNIX socket each, sharing the sender's memfd ring.
// Reads nothing of `config`: a peer on this node is checked by its uid.
Result<std::unique_ptr<transport::Transport>> create_transport(
    const transport::TransportConfig& config);

}  // namespace ferry::shm

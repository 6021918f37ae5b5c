// The net transport's entry in the registry (transport/registry.h).
#pragma once

#include <memory>

#include "ferry/status.h"
#include "transport/transport.h"

namespace ferry::net {

// Processes on other nodes, over UCX, authenticated with the session secret: one Context for
// everything it makes. Reads the secret now (config.secret_file, else FERRY_TOKEN /
// FERRY_TOKEN_FILE); kUnauthenticated saying how to provide one when there is none.
Result<std::unique_ptr<transport::Transport>> create_transport(
    const transport::TransportConfig& config);

}  // namespace ferry::net

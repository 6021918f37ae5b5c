// The one factory of transport::Channel: the address picks the transport.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "ferry/status.h"
#include "transport/net/auth.h"
#include "transport/net/channel.h"
#include "transport/transport.h"

namespace ferry::transport {

// What a net address needs; unused for shm addresses.
struct NetConnectOptions {
  std::shared_ptr<net::Context> context;  // the channel lives on it; required for net
  std::optional<net::Token> token;        // the session secret (nullopt: the listener refuses)
  net::ConnectOptions connect;
};

// Connects to the listener at `address` within `timeout`: shm::connect for "@name", a name or
// a path, net::connect for "host:port" (is_net_address). Errors as those two.
Result<std::unique_ptr<Channel>> connect(const std::string& address,
                                         std::chrono::milliseconds timeout,
                                         const NetConnectOptions& net = {});

}  // namespace ferry::transport

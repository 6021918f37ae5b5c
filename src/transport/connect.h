// The factories of transport::Channel and transport::Listener: the address picks the
// transport.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "ferry/status.h"
#include "ferry/wire_protect.h"
#include "transport/net/auth.h"
#include "transport/net/channel.h"
#include "transport/transport.h"

namespace ferry::transport {

// What a net address needs; unused for shm addresses.
struct NetConnectOptions {
  // The UCX context the channel lives on; nullptr: one of its own.
  std::shared_ptr<net::Context> context;
  std::optional<net::Token> token;  // the session secret (nullopt: the listener refuses)
  net::ConnectOptions connect;
  // The least protection this end accepts on the segments it receives (the sender chooses).
  WireProtect minimum_segment_protection = WireProtect::kNone;
};

// Connects to the listener at `address` within `timeout`: shm::connect for "@name", a name or
// a path, net::connect for "host:port" (is_net_address). Errors as those two.
Result<std::unique_ptr<Channel>> connect(const std::string& address,
                                         std::chrono::milliseconds timeout,
                                         const NetConnectOptions& net = {});

// What a net address needs to listen; unused for shm addresses.
struct NetListenOptions {
  // The UCX context accepted channels live on; nullptr: one of its own.
  std::shared_ptr<net::Context> context;
  std::optional<net::Token> token;  // the session secret: required for a net address
  net::ListenerOptions listener;
  // How accepted channels protect the segments they publish.
  WireProtect segment_protection = WireProtect::kNone;
};

// Binds a listener at `address`: shm::Listener::bind for "@name", a name or a path,
// net::Listener::bind for "host:port" (port 0: an ephemeral one; see address()). An address
// in use is an error naming it.
Result<std::unique_ptr<Listener>> listen(const std::string& address,
                                         const NetListenOptions& net = {});

}  // namespace ferry::transport

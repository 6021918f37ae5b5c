// Picks a Transport by the address's scheme, so callers never branch on addresses:
//   "@name", a name or a path   shm, a process on this node
//   "host:port"                 net (UCX), a process on another node
//   "<scheme>://..."            the transport registered under <scheme> (none yet; shm and
//                               net are never written so)
// Adding a transport is a folder under transport/ with a create_transport(config) and one
// line in registry.cc's table.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "ferry/status.h"
#include "transport/transport.h"

namespace ferry::transport {

// The transports of one end, made from one config, each on first use of its scheme and then
// shared by every listen and connect (net: one UCX Context, so one wait loop hears them
// all). Movable, not copyable; used by one thread at a time.
class Registry {
 public:
  explicit Registry(TransportConfig config) : config_(std::move(config)) {}

  // The scheme `address` names ("shm", "net", or the one written before "://").
  static std::string scheme_of(const std::string& address);

  // The transport for `address`, made on first use. kInvalidArgument "unknown transport
  // scheme" naming the address when none is registered; a transport that cannot be made
  // (net without the session secret) is that error.
  Result<Transport*> for_address(const std::string& address);
  // for_address(address), then its listen() or connect().
  Result<std::unique_ptr<Listener>> listen(const std::string& address);
  Result<std::unique_ptr<Channel>> connect(const std::string& address,
                                           std::chrono::milliseconds timeout,
                                           const std::string& role = "sender");

 private:
  TransportConfig config_;
  std::map<std::string, std::unique_ptr<Transport>, std::less<>> made_;
};

}  // namespace ferry::transport

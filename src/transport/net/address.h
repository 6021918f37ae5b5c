// "host:port" text <-> socket addresses, for the net transport's listener and connect.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "ferry/status.h"

namespace ferry::net {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

struct HostPort {
  std::string host;  // without an IPv6 address's brackets
  std::string port;
};

// Splits "host:port" or "[ipv6]:port"; an error names the address and the form it lacks.
Result<HostPort> split_host_port(const std::string& host_port);
// "host:port", or "[host]:port" for an IPv6 address.
std::string join_host_port(const std::string& host, const std::string& port);
// Whether `host` (as split) names every interface: 0.0.0.0 or ::.
bool every_interface(const std::string& host);

// Resolves "host:port" or "[ipv6]:port" (numeric or by name, first IPv4/IPv6 answer).
// Port 0 asks a listener for an ephemeral port. `passive`: for binding (an empty
// host is never accepted; use 0.0.0.0 or [::] for every interface).
Result<SocketAddress> resolve(const std::string& host_port, bool passive);

// "1.2.3.4:5678" or "[::1]:5678"; "?" for an address family it does not know.
std::string format_address(const sockaddr* address);

}  // namespace ferry::net

#include "transport/net/address.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>

#include "base/status_macros.h"

namespace ferry::net {

Result<HostPort> split_host_port(const std::string& host_port) {
  HostPort out;
  if (!host_port.empty() && host_port[0] == '[') {
    const auto close = host_port.find(']');
    if (close == std::string::npos || close + 1 >= host_port.size() ||
        host_port[close + 1] != ':') {
      return invalid_argument(
          fmt::format("address '{}' is not of the form [ipv6]:port", host_port));
    }
    out.host = host_port.substr(1, close - 1);
    out.port = host_port.substr(close + 2);
  } else {
    const auto colon = host_port.rfind(':');
    if (colon == std::string::npos || host_port.find(':') != colon) {
      return invalid_argument(
          fmt::format("address '{}' is not of the form host:port (IPv6: [addr]:port)", host_port));
    }
    out.host = host_port.substr(0, colon);
    out.port = host_port.substr(colon + 1);
  }
  return out;
}

std::string join_host_port(const std::string& host, const std::string& port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

bool every_interface(const std::string& host) { return host == "0.0.0.0" || host == "::"; }

Result<SocketAddress> resolve(const std::string& host_port, bool passive) {
  FERRY_ASSIGN_OR_RETURN(HostPort split, split_host_port(host_port));
  const std::string& host = split.host;
  const std::string& port = split.port;
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535) {
    return invalid_argument(
        fmt::format("address '{}' has port '{}', not a number 0..65535", host_port, port));
  }
  if (host.empty()) {
    return invalid_argument(fmt::format("address '{}' has no host", host_port));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    return not_found(fmt::format("cannot resolve '{}': {}", host_port, ::gai_strerror(rc)));
  }
  SocketAddress out;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    std::memcpy(&out.storage, a->ai_addr, a->ai_addrlen);
    out.length = a->ai_addrlen;
    break;
  }
  ::freeaddrinfo(found);
  if (out.length == 0) {
    return not_found(fmt::format("'{}' has no IPv4 or IPv6 address", host_port));
  }
  return out;
}

std::string format_address(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    return fmt::format("{}:{}", text, ntohs(in->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    return fmt::format("[{}]:{}", text, ntohs(in6->sin6_port));
  }
  return "?";
}

}  // namespace ferry::net

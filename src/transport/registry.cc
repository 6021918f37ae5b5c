#include "transport/registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string_view>

#include "base/status_macros.h"
#include "transport/net/net_transport.h"
#include "transport/shm/shm_transport.h"

namespace ferry::transport {

namespace {

using Factory = Result<std::unique_ptr<Transport>> (*)(const TransportConfig&);

struct Entry {
  std::string_view scheme;
  Factory create;
  // Picked by the address's form ("@name", "host:port"), never written as "<scheme>://":
  // its transport would be handed an address it cannot read.
  bool by_form = false;
};

// One line per transport; a new one is written "<scheme>://...".
constexpr Entry kTransports[] = {
    {"shm", &shm::create_transport, true},
    {"net", &net::create_transport, true},
};

// "host:port": a colon and no slash; "@name", names and paths are shm (shm/local_address.h).
bool is_net_address(const std::string& address) {
  return !address.empty() && address[0] != '@' && address.find('/') == std::string::npos &&
         address.find(':') != std::string::npos;
}

// The scheme written as "<scheme>://" (letters, digits, '+', '-', '.'), or empty.
std::string_view written_scheme(std::string_view address) {
  const auto end = address.find("://");
  if (end == std::string_view::npos || end == 0) return {};
  const auto scheme = address.substr(0, end);
  const bool valid = std::all_of(scheme.begin(), scheme.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
  });
  return valid ? scheme : std::string_view();
}

}  // namespace

std::string Registry::scheme_of(const std::string& address) {
  const auto written = written_scheme(address);
  if (!written.empty()) return std::string(written);
  return is_net_address(address) ? "net" : "shm";
}

Result<Transport*> Registry::for_address(const std::string& address) {
  const bool written = !written_scheme(address).empty();
  const std::string scheme = scheme_of(address);
  const auto* entry =
      std::find_if(std::begin(kTransports), std::end(kTransports),
                   [&](const Entry& e) { return e.scheme == scheme && e.by_form != written; });
  if (entry == std::end(kTransports)) {
    return invalid_argument(fmt::format(
        "unknown transport scheme '{}' in address '{}' (known: \"@name\" or a path for shm, "
        "\"host:port\" for net)",
        scheme, address));
  }
  if (auto it = made_.find(scheme); it != made_.end()) return it->second.get();
  FERRY_ASSIGN_OR_RETURN(auto made, entry->create(config_));
  return made_.emplace(scheme, std::move(made)).first->second.get();
}

Result<std::unique_ptr<Listener>> Registry::listen(const std::string& address) {
  FERRY_ASSIGN_OR_RETURN(Transport * transport, for_address(address));
  return transport->listen(address);
}

Result<std::unique_ptr<Channel>> Registry::connect(const std::string& address,
                                                   std::chrono::milliseconds timeout,
                                                   const std::string& role) {
  FERRY_ASSIGN_OR_RETURN(Transport * transport, for_address(address));
  return transport->connect(address, timeout, role);
}

}  // namespace ferry::transport

#include "transport/transport.h"

#include "transport/connect.h"
#include "transport/net/message_channel.h"
#include "transport/shm/message_channel.h"

namespace ferry::transport {

bool is_net_address(const std::string& address) {
  return !address.empty() && address[0] != '@' && address.find('/') == std::string::npos &&
         address.find(':') != std::string::npos;
}

Status Channel::send_with_fd(std::span<const std::byte>, std::chrono::milliseconds, int) {
  return failed_precondition("a channel to " + peer() + " cannot pass descriptors");
}

Result<std::vector<std::byte>> Channel::receive_with_fd(std::chrono::milliseconds timeout,
                                                        ScopedFd*) {
  return receive(timeout);
}

Result<std::unique_ptr<Channel>> connect(const std::string& address,
                                         std::chrono::milliseconds timeout,
                                         const NetConnectOptions& net) {
  if (!is_net_address(address)) {
    auto channel = shm::connect(address, timeout);
    if (!channel.ok()) return channel.status();
    return std::unique_ptr<Channel>(std::make_unique<shm::MessageChannel>(std::move(*channel)));
  }
  if (net.context == nullptr) {
    return invalid_argument("connecting to net address " + address + " needs a net::Context");
  }
  auto channel = net::connect(net.context, address, net.token, timeout, net.connect);
  if (!channel.ok()) return channel.status();
  return std::unique_ptr<Channel>(std::make_unique<net::MessageChannel>(std::move(*channel)));
}

}  // namespace ferry::transport

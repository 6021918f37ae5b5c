#include "transport/transport.h"

#include "transport/connect.h"
#include "transport/net/message_channel.h"
#include "transport/net/message_listener.h"
#include "transport/shm/message_channel.h"
#include "transport/shm/message_listener.h"

namespace ferry::transport {

bool is_net_address(const std::string& address) {
  return !address.empty() && address[0] != '@' && address.find('/') == std::string::npos &&
         address.find(':') != std::string::npos;
}

// net::Poller without a Context is exactly a plain poll() (EINTR and all).
std::unique_ptr<Poller> plain_poller() { return std::make_unique<net::ProgressPoller>(nullptr); }

Status Channel::send_with_fd(std::span<const std::byte>, std::chrono::milliseconds, int) {
  return failed_precondition("a channel to " + peer() + " cannot pass descriptors");
}

Result<std::vector<std::byte>> Channel::receive_with_fd(std::chrono::milliseconds timeout,
                                                        ScopedFd*) {
  return receive(timeout);
}

// The segment calls of a transport that shares memory: the peer reads the ring itself.
Result<std::unique_ptr<Region>> Channel::register_memory(std::span<std::byte>) {
  return std::unique_ptr<Region>();
}
Status Channel::publish_segment(std::span<const std::byte>, const Region*) { return ok_status(); }
Status Channel::check_segments() { return ok_status(); }
Status Channel::await_segments(std::chrono::milliseconds) { return ok_status(); }
Status Channel::receive_segment(std::span<std::byte>, const Region*, std::chrono::milliseconds) {
  return ok_status();
}

namespace {

Result<std::shared_ptr<net::Context>> context_or_new(std::shared_ptr<net::Context> context) {
  if (context != nullptr) return context;
  return net::Context::create();
}

}  // namespace

Result<std::unique_ptr<Channel>> connect(const std::string& address,
                                         std::chrono::milliseconds timeout,
                                         const NetConnectOptions& net) {
  if (!is_net_address(address)) {
    auto channel = shm::connect(address, timeout);
    if (!channel.ok()) return channel.status();
    return std::unique_ptr<Channel>(std::make_unique<shm::MessageChannel>(std::move(*channel)));
  }
  auto context = context_or_new(net.context);
  if (!context.ok()) return context.status();
  auto channel = net::connect(*context, address, net.token, timeout, net.connect);
  if (!channel.ok()) return channel.status();
  // The sender chooses how segments travel; this end only sets the least it takes.
  channel->set_bulk_protection(WireProtect::kNone, net.minimum_segment_protection);
  return std::unique_ptr<Channel>(std::make_unique<net::MessageChannel>(std::move(*channel)));
}

Result<std::unique_ptr<Listener>> listen(const std::string& address, const NetListenOptions& net) {
  if (!is_net_address(address)) {
    auto listener = shm::Listener::bind(address);
    if (!listener.ok()) return listener.status();
    return std::unique_ptr<Listener>(std::make_unique<shm::MessageListener>(std::move(*listener)));
  }
  if (!net.token) {
    return invalid_argument("listening on net address " + address + " needs the session token");
  }
  auto context = context_or_new(net.context);
  if (!context.ok()) return context.status();
  auto listener = net::Listener::bind(*context, address, *net.token, net.listener);
  if (!listener.ok()) return listener.status();
  return std::unique_ptr<Listener>(std::make_unique<net::MessageListener>(
      *context, std::move(*listener), net.segment_protection));
}

}  // namespace ferry::transport

#include "transport/transport.h"

#include <fmt/format.h>

#include "transport/net/message_channel.h"

namespace ferry::transport {

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

Result<std::unique_ptr<Ring>> Transport::map_peer_ring(ScopedFd, std::uint32_t, std::uint64_t,
                                                       const std::string& peer) {
  return failed_precondition(
      fmt::format("transport {} shares no memory: {} passed a ring it cannot map", scheme(), peer));
}

Result<std::string> Transport::reachable_address(const std::string& listening,
                                                 const std::string&) const {
  return listening;
}

Status Transport::read_peer_memory(const ScopedFd&, std::uint64_t, std::span<std::byte>,
                                   const std::string& peer) {
  return failed_precondition(fmt::format(
      "transport {} shares no memory: {} passed memory it cannot read", scheme(), peer));
}

}  // namespace ferry::transport

#include "transport/shm/shm_transport.h"

#include "transport/shm/memfd_ring.h"
#include "transport/shm/message_channel.h"
#include "transport/shm/message_listener.h"

namespace ferry::shm {

namespace {

class ShmTransport final : public transport::Transport {
 public:
  const std::string& scheme() const override { return scheme_; }
  bool shares_memory() const override { return true; }
  // connect() only looks for the socket file, so a retry costs nothing.
  bool connect_in_slices() const override { return true; }

  Result<std::unique_ptr<transport::Listener>> listen(const std::string& address) override {
    auto listener = Listener::bind(address);
    if (!listener.ok()) return listener.status();
    return std::unique_ptr<transport::Listener>(
        std::make_unique<MessageListener>(std::move(*listener)));
  }

  using transport::Transport::connect;
  Result<std::unique_ptr<transport::Channel>> connect(const std::string& address,
                                                      std::chrono::milliseconds timeout,
                                                      const std::string& role) override {
    auto channel = shm::connect(address, timeout, role);
    if (!channel.ok()) return channel.status();
    return std::unique_ptr<transport::Channel>(
        std::make_unique<MessageChannel>(std::move(*channel)));
  }

  Result<std::unique_ptr<transport::Ring>> allocate_ring(std::uint32_t slots,
                                                         std::uint64_t slot_bytes) override {
    return boxed_ring(MemfdRing::create(slots, slot_bytes));
  }

  Result<std::unique_ptr<transport::Ring>> map_peer_ring(ScopedFd fd, std::uint32_t slots,
                                                         std::uint64_t slot_bytes,
                                                         const std::string& peer) override {
    return boxed_ring(MemfdRing::map_readonly(std::move(fd), slots, slot_bytes, peer));
  }
  Status read_peer_memory(const ScopedFd& fd, std::uint64_t offset, std::span<std::byte> into,
                          const std::string& peer) override {
    return MemfdRing::read_passed(fd.get(), offset, into, peer);
  }

 private:
  const std::string scheme_ = "shm";
};

}  // namespace

Result<std::unique_ptr<transport::Transport>> create_transport(const transport::TransportConfig&) {
  return std::unique_ptr<transport::Transport>(std::make_unique<ShmTransport>());
}

}  // namespace ferry::shm

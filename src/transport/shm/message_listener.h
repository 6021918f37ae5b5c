// shm's transport::Listener: a shm::Listener at a local address, whose accepted channels
// share memory and are polled on their own sockets.
#pragma once

#include <memory>
#include <string>

#include "transport/shm/seqpacket_channel.h"
#include "transport/transport.h"

namespace ferry::shm {

class MessageListener final : public transport::Listener {
 public:
  explicit MessageListener(shm::Listener listener);

  Result<std::unique_ptr<transport::Channel>> accept(std::chrono::milliseconds timeout) override;
  int fd() const override { return listener_.fd(); }
  const std::string& address() const override { return address_; }
  // Closes the socket and removes its file.
  void close() override { listener_ = shm::Listener(); }
  // Peers map the memory itself: nothing to register.
  Result<std::unique_ptr<transport::Region>> register_memory(std::span<std::byte>) override {
    return std::unique_ptr<transport::Region>();
  }
  std::unique_ptr<transport::Poller> poller() const override { return transport::plain_poller(); }

 private:
  shm::Listener listener_;
  std::string address_;
};

}  // namespace ferry::shm

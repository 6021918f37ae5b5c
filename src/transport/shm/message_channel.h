// shm's transport::Channel: a seqpacket channel to a process on this node, which maps the
// memory this end passes it (shares_memory, passes_fds) and is polled on its own socket.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

#include "transport/shm/seqpacket_channel.h"
#include "transport/transport.h"

namespace ferry::shm {

class MessageChannel final : public transport::Channel {
 public:
  explicit MessageChannel(shm::Channel channel) : channel_(std::move(channel)) {}

  bool shares_memory() const override { return true; }
  bool passes_fds() const override { return true; }

  Status send(std::span<const std::byte> message, std::chrono::milliseconds timeout) override;
  Status send_with_fd(std::span<const std::byte> message, std::chrono::milliseconds timeout,
                      int fd) override;
  Result<std::vector<std::byte>> receive(std::chrono::milliseconds timeout) override;
  Result<std::vector<std::byte>> receive_with_fd(std::chrono::milliseconds timeout,
                                                 ScopedFd* fd) override;
  Result<std::optional<std::vector<std::byte>>> try_receive(
      std::chrono::milliseconds rest_within) override;
  int poll_fd() const override { return channel_.fd(); }

  // Posted messages wait here, the first perhaps part sent, until the socket takes them.
  Result<std::size_t> post(std::vector<std::byte> message) override;
  Result<std::size_t> flush_posted() override;

  int fd() const override { return channel_.fd(); }
  bool valid() const override { return channel_.valid(); }
  void close() override { channel_.close(); }
  void abort() override { channel_.close(); }  // nothing lingers on a local socket
  const std::string& peer() const override { return channel_.peer(); }
  void set_peer(std::string peer) override { channel_.set_peer(std::move(peer)); }

 private:
  shm::Channel channel_;
  std::deque<std::vector<std::byte>> posted_;
  std::size_t front_sent_ = 0;  // bytes of posted_.front() the socket took
};

}  // namespace ferry::shm

// net's transport::Channel: a UCX channel to a process on another node. Segments travel as
// bulk messages (net() gives the channel for them); messages arrive through the Context's
// progress engine (net::Poller), so fd() is the Context's event fd.
#pragma once

#include "transport/net/channel.h"
#include "transport/transport.h"

namespace ferry::net {

class MessageChannel final : public transport::Channel {
 public:
  explicit MessageChannel(net::Channel channel)
      : channel_(std::move(channel)), name_(channel_.valid() ? channel_.peer() : "") {}

  bool shares_memory() const override { return false; }
  bool passes_fds() const override { return false; }
  bool needs_progress() const override { return true; }

  Status send(std::span<const std::byte> message, std::chrono::milliseconds timeout) override {
    return channel_.send(message, timeout);
  }
  Result<std::vector<std::byte>> receive(std::chrono::milliseconds timeout) override {
    return channel_.receive(timeout);
  }
  Result<std::optional<std::vector<std::byte>>> try_receive() override {
    return channel_.try_receive();
  }

  int fd() const override { return channel_.fd(); }
  bool valid() const override { return channel_.valid(); }
  void close() override { channel_.close(); }
  void abort() override { channel_.abort(); }
  // "peer host:port" as the channel named itself, until set_peer says who the peer is; kept
  // here, so it still names the peer after close().
  const std::string& peer() const override { return name_; }
  void set_peer(std::string peer) override { name_ = std::move(peer); }

  // The bulk path and what UCX chose (net::Channel's own calls).
  net::Channel& net() { return channel_; }

 private:
  net::Channel channel_;
  std::string name_;
};

}  // namespace ferry::net

// net's transport::Channel: a UCX channel to a process on another node. Segments travel as
// bulk messages, keyed by the count both ends keep; messages arrive through the Context's
// progress engine (net::Poller), so fd() is the Context's event fd.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "transport/net/channel.h"
#include "transport/net/context.h"
#include "transport/net/poller.h"
#include "transport/transport.h"

namespace ferry::net {

// net's transport::Region: memory registered with a Context.
class RegisteredRegion final : public transport::Region {
 public:
  explicit RegisteredRegion(MemoryRegion region) : region_(std::move(region)) {}
  const MemoryRegion& region() const { return region_; }

 private:
  MemoryRegion region_;
};

// net's transport::Poller: net::Poller over a Context it keeps alive (nullptr: a plain poll()).
class ProgressPoller final : public transport::Poller {
 public:
  explicit ProgressPoller(std::shared_ptr<Context> context)
      : context_(std::move(context)), poller_(context_.get()) {}
  bool progress() override { return poller_.progress(); }
  Result<int> wait(std::vector<pollfd>& fds, std::chrono::milliseconds timeout,
                   bool watch_engine) override {
    return poller_.wait(fds, timeout, watch_engine);
  }

 private:
  std::shared_ptr<Context> context_;
  net::Poller poller_;
};

// Registers `memory` with `context` as a transport::Region.
Result<std::unique_ptr<transport::Region>> register_region(Context& context,
                                                           std::span<std::byte> memory);

class MessageChannel final : public transport::Channel {
 public:
  explicit MessageChannel(net::Channel channel);

  bool shares_memory() const override { return false; }
  bool passes_fds() const override { return false; }

  Status send(std::span<const std::byte> message, std::chrono::milliseconds timeout) override {
    return channel_.send(message, timeout);
  }
  Result<std::vector<std::byte>> receive(std::chrono::milliseconds timeout) override {
    return channel_.receive(timeout);
  }
  // A net message arrives whole (the engine assembles it): nothing to wait for.
  Result<std::optional<std::vector<std::byte>>> try_receive(std::chrono::milliseconds) override {
    return channel_.try_receive();
  }
  int poll_fd() const override { return -1; }  // the Poller's engine reports it

  // A send that times out leaves its message queued in the engine, whole: nothing to keep.
  Result<std::size_t> post(std::vector<std::byte> message) override;
  Result<std::size_t> flush_posted() override { return channel_.sends_in_flight(); }

  int fd() const override { return channel_.fd(); }
  bool valid() const override { return channel_.valid(); }
  void close() override { channel_.close(); }
  // First the channel: it cancels the segment sends still in flight.
  void abort() override {
    channel_.abort();
    sends_.clear();
  }
  // "peer host:port" as the channel named itself, until set_peer says who the peer is; kept
  // here, so it still names the peer after close().
  const std::string& peer() const override { return name_; }
  void set_peer(std::string peer) override { name_ = std::move(peer); }
  std::string peer_address() const override { return address_; }
  std::string transports() const override { return transports_; }
  std::unique_ptr<transport::Poller> poller() const override;

  Result<std::unique_ptr<transport::Region>> register_memory(std::span<std::byte> memory) override;
  Status publish_segment(std::span<const std::byte> bytes,
                         const transport::Region* region) override;
  Status check_segments() override;
  Status await_segments(std::chrono::milliseconds timeout) override;
  Status receive_segment(std::span<std::byte> into, const transport::Region* region,
                         std::chrono::milliseconds timeout) override;

 private:
  net::Channel channel_;
  std::string name_;
  std::string address_;     // "host:port"
  std::string transports_;  // what UCX chose
  // Segment keys: each end counts the segments it published or received, so both agree.
  std::uint32_t published_ = 0;
  std::uint32_t received_ = 0;
  // After channel_: destroyed first, while the endpoint is still there.
  std::deque<Transfer> sends_;
};

}  // namespace ferry::net

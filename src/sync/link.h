// One control connection of a sync session, over a transport::Channel: shm to a process on
// this node, or net (UCX) to one on another node. Sender, Receiver and Relay speak the same
// wire messages over both; only the bulk path differs (peers that share memory read the
// ring, the others get each segment's bytes sent to them), chosen by capability.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "sync/sync_options.h"
#include "transport/registry.h"
#include "transport/transport.h"
#include "wire/conversation.h"
#include "wire/message.h"

namespace ferry::sync {

// One control connection of a session, over whichever transport its address picked.
class Link {
 public:
  Link() = default;
  explicit Link(std::unique_ptr<transport::Channel> channel);

  // What the link's transport can do (transport/transport.h).
  bool shares_memory() const { return channel_->shares_memory(); }
  bool passes_fds() const { return channel_->passes_fds(); }

  Status send(std::span<const std::byte> message, std::chrono::milliseconds timeout);
  // passes_fds() only: passes `fd` with the message (the ring, with WELCOME).
  Status send_with_fd(std::span<const std::byte> message, std::chrono::milliseconds timeout,
                      int fd);
  // One whole message; negative timeout waits forever.
  Result<std::vector<std::byte>> receive(std::chrono::milliseconds timeout);
  // The same; a descriptor passed with the message lands in *fd.
  Result<std::vector<std::byte>> receive_with_fd(std::chrono::milliseconds timeout, ScopedFd* fd);
  // For a receive loop over many links (transport::Poller): a message that arrived, if
  // any, read whole within `rest_within` once begun (transport::Channel::try_receive).
  Result<std::optional<std::vector<std::byte>>> try_receive(std::chrono::milliseconds rest_within);
  // What the loop polls for this link beside its Poller (-1: the Poller's engine reports it).
  int poll_fd() const { return channel_ ? channel_->poll_fd() : -1; }
  bool valid() const { return channel_ && channel_->valid(); }
  void close();
  // close() without lingering to flush: for a session that already failed.
  void abort();
  const std::string& peer() const;
  void set_peer(std::string peer);
  // For logs: "host:port" and "tcp/lo" of a peer on another node; empty on this node.
  std::string peer_address() const { return channel_ ? channel_->peer_address() : ""; }
  std::string transports() const { return channel_ ? channel_->transports() : ""; }

  // The segment path (transport::Channel's): callers skip it on links that shares_memory().
  transport::Channel& channel() { return *channel_; }

 private:
  std::unique_ptr<transport::Channel> channel_;
};

// A message of `session` in `round`: what every end of a session sends.
wire::Message session_message(std::uint64_t session, std::uint64_t round, wire::Body body);

// The transports' config of a sync end: the session secret (token_file) and wire_protect.
transport::TransportConfig transport_config(const SyncOptions& options);

// A receiving end's connection to its sender at `address`, on the transport `transports`
// picks for it. A transport that connects in slices is retried until options.timeout, so
// Ctrl-C is heard while no sender listens yet.
Result<Link> connect_upstream(const std::string& address, const SyncOptions& options,
                              transport::Registry& transports);

// Waits for one whole message on `link` in slices, so options.interrupt is heard between
// them (Ctrl-C, Relay::stop); a negative timeout waits forever. A timeout names the peer and
// the whole time waited, not the last slice.
Result<std::vector<std::byte>> receive_heeding_interrupt(Link& link,
                                                         std::chrono::milliseconds timeout,
                                                         const SyncOptions& options,
                                                         InterruptCheck& interrupted);

// Decodes a message from the sender, checks that it may come now, and turns an ERROR into
// kAborted with the sender's reason (then `*sender_error`, when given, is set).
Result<wire::Message> decode_from_sender(std::span<const std::byte> bytes, const Link& link,
                                         wire::Conversation& conversation,
                                         bool* sender_error = nullptr);

}  // namespace ferry::sync

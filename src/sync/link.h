// One control connection of a sync session, over either transport: a shm::Channel to a
// process on this node, or a net::Channel (UCX) to one on another node. Sender, Receiver
// and Relay speak the same wire messages over both; only the bulk path differs (shm peers
// read the shared ring, net peers get each segment's bytes sent to them).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "transport/net/channel.h"
#include "wire/conversation.h"
#include "wire/message.h"
#include "transport/shm/seqpacket_channel.h"

namespace ferry::sync {

// "@name", "name" and paths are shm addresses (transport/shm/local_address.h); "host:port"
// (a colon, no slash) is a net address.
bool is_net_address(const std::string& address);

class Link {
 public:
  Link() = default;
  explicit Link(shm::Channel c) : channel_(std::move(c)) {}
  explicit Link(net::Channel c) : channel_(std::move(c)) {}

  Status send(std::span<const std::byte> message, std::chrono::milliseconds timeout);
  // shm only: passes `fd` with the message (the ring, with WELCOME).
  Status send_with_fd(std::span<const std::byte> message, std::chrono::milliseconds timeout,
                      int fd);
  // One whole message; negative timeout waits forever.
  Result<std::vector<std::byte>> receive(std::chrono::milliseconds timeout);
  // The same; a descriptor passed with the message (shm only) lands in *fd.
  Result<std::vector<std::byte>> receive_with_fd(std::chrono::milliseconds timeout, ScopedFd* fd);
  // For a poll() loop over many links: a message that already arrived, if any (net links
  // after Context::progress()); shm links answer std::nullopt and are polled on fd().
  Result<std::optional<std::vector<std::byte>>> try_receive();

  bool is_net() const { return std::holds_alternative<net::Channel>(channel_); }
  net::Channel& net() { return std::get<net::Channel>(channel_); }
  // shm: the socket; net: the Context's event fd, shared by all its links.
  int fd() const;
  bool valid() const;
  void close();
  // close() without lingering to flush (net): for a session that already failed.
  void abort();
  const std::string& peer() const;
  void set_peer(std::string peer);

 private:
  std::variant<std::monostate, shm::Channel, net::Channel> channel_;
  std::string net_peer_;  // net channels name themselves by address; this overrides it
};

// The session secret for net sessions: options.token_file, else FERRY_TOKEN /
// FERRY_TOKEN_FILE. The error says how to provide one.
Result<net::Token> session_token(const SyncOptions& options);

// A receiving end's connection to its sender: shm for "@name" or a path, else net (with
// its own UCX context, returned in *context, authenticated with the session token).
Result<Link> connect_upstream(const std::string& address, const SyncOptions& options,
                              std::shared_ptr<net::Context>* context);

// Decodes a message from the sender, checks that it may come now, and turns an ERROR into
// kAborted with the sender's reason.
Result<wire::Message> decode_from_sender(std::span<const std::byte> bytes, const Link& link,
                                         wire::Conversation& conversation);

// Net: receives bulk message `key` (a segment's bytes) into `into`, which lies in `region`.
Status receive_segment(Link& link, std::uint32_t key, std::span<std::byte> into,
                       const net::MemoryRegion& region, std::chrono::milliseconds timeout);

}  // namespace ferry::sync

// The seam between sync and the transports. A Channel carries whole control messages, in
// order, to one peer, with a timeout on each call; a dead peer is kAborted naming it, silence
// is kTimeout. Two transports implement it, in mirrored folders: shm/ (a UNIX socket to a
// process on this node, which maps the sender's ring) and net/ (UCX to another node, which
// gets each segment's bytes sent to it). Callers branch on the capability queries, never on
// which transport they hold. connect() picks the transport from the address.
//
// Like the transports, a Channel is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "ferry/status.h"

namespace ferry::transport {

// The largest control message every transport carries: a body of 64 MiB and a header of up
// to 28 bytes. The protocol above (wire/) keeps its messages within it (sync/link.cc checks
// at compile time); the value is on the wire, as net's frame limit, so it never shrinks.
inline constexpr std::size_t kMaxMessageBytes = (64u << 20) + 28;

// "@name", "name" and paths are shm addresses (shm/local_address.h); "host:port" (a colon,
// no slash) is a net address.
bool is_net_address(const std::string& address);

class Channel {
 public:
  virtual ~Channel() = default;

  // Capabilities.
  // The peer maps memory this end passes it (the ring), so segments need no bytes sent;
  // false: each segment's bytes travel as a bulk message (net::Channel::send_bulk).
  virtual bool shares_memory() const = 0;
  // send_with_fd / receive_with_fd carry a descriptor with the message.
  virtual bool passes_fds() const = 0;
  // Messages arrive through a progress engine (net::Poller): fd() is the engine's event fd,
  // shared by all its channels, and try_receive() reads them. false: fd() is this channel's
  // own and polls readable when a message waits.
  virtual bool needs_progress() const = 0;

  // Sends one whole message (at most kMaxMessageBytes); waits at most `timeout` for room.
  virtual Status send(std::span<const std::byte> message, std::chrono::milliseconds timeout) = 0;
  // passes_fds() only (else kFailedPrecondition): sends `fd` with the message.
  virtual Status send_with_fd(std::span<const std::byte> message, std::chrono::milliseconds timeout,
                              int fd);
  // Waits for one whole message; a negative timeout waits forever.
  virtual Result<std::vector<std::byte>> receive(std::chrono::milliseconds timeout) = 0;
  // The same; a descriptor passed with the message (passes_fds() only) lands in *fd.
  virtual Result<std::vector<std::byte>> receive_with_fd(std::chrono::milliseconds timeout,
                                                         ScopedFd* fd);
  // needs_progress() only: a message that already arrived, if any (after the engine's
  // progress); others answer std::nullopt and are polled on fd().
  virtual Result<std::optional<std::vector<std::byte>>> try_receive() = 0;

  virtual int fd() const = 0;
  virtual bool valid() const = 0;
  // Closes after flushing what was sent (the peer sees kAborted).
  virtual void close() = 0;
  // Closes at once, without lingering to flush: for a session that already failed.
  virtual void abort() = 0;
  // How errors name the peer; set_peer renames it once it has said who it is.
  virtual const std::string& peer() const = 0;
  virtual void set_peer(std::string peer) = 0;
};

}  // namespace ferry::transport

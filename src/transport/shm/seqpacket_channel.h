// The control path of the shm transport: a UNIX-domain SOCK_SEQPACKET socket.
//
// SEQPACKET keeps message boundaries and reports a dead peer as EOF at once,
// which is how each side learns of a kill -9 without waiting for a timeout.
// A message larger than one datagram (a BEGIN manifest of many tensors) is sent
// as consecutive chunks whose first byte says whether more follow.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "ferry/status.h"
#include "transport/transport.h"

namespace ferry::shm {

// Payload bytes per datagram; well under the default socket buffer (~208 KiB).
inline constexpr std::size_t kChunkBytes = 32 * 1024;
// The largest message a channel sends or reassembles: the seam's, as for every transport.
inline constexpr std::size_t kMaxMessageBytes = transport::kMaxMessageBytes;

struct Received {
  std::vector<std::byte> bytes;
  ScopedFd fd;  // a descriptor passed with the message, if any
};

class Channel {
 public:
  Channel() = default;
  Channel(ScopedFd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {}

  // Sends one message (at most kMaxMessageBytes, else kInvalidArgument), and `pass_fd` with
  // it (SCM_RIGHTS) when >= 0. Waits at most
  // `timeout` for room in the socket buffer (a peer that stopped reading). A timeout may
  // leave the message cut; with `sent`, it starts that many bytes in (where an earlier call
  // that timed out left it) and leaves there how far it got, so the caller can finish it.
  Status send(std::span<const std::byte> message, std::chrono::milliseconds timeout,
              int pass_fd = -1, std::size_t* sent = nullptr);
  // Waits for one whole message; a negative timeout waits forever. EOF is kAborted,
  // no message in time is kTimeout; both name the peer.
  Result<Received> receive(std::chrono::milliseconds timeout);

  int fd() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }
  void close() { fd_.reset(); }
  const std::string& peer() const { return peer_; }
  void set_peer(std::string peer) { peer_ = std::move(peer); }

 private:
  ScopedFd fd_;
  std::string peer_;
};

// A bound, listening socket at one of the addresses of transport/shm/local_address.h
// ("@name" abstract, "name" in this user's private directory, "a/path"); socket files
// are created with mode 0600 and removed with the Listener. A name in use is an
// kAlreadyExists error naming the holder (pid, uid); a stale socket file is replaced.
// accept() drops (and logs) peers running as another user (SO_PEERCRED) and goes on
// waiting; connect() refuses a listener of another user.
class Listener {
 public:
  static Result<Listener> bind(const std::string& address);
  Listener() = default;
  Listener(Listener&& o) noexcept;
  Listener& operator=(Listener&& o) noexcept;
  ~Listener();

  // Waits up to `timeout` (negative: forever) for one peer of this user.
  Result<Channel> accept(std::chrono::milliseconds timeout);
  const std::string& address() const { return address_; }
  int fd() const { return fd_.get(); }

 private:
  ScopedFd fd_;
  std::string address_;
  std::string path_;  // the socket file we created, if any
};

// Connects to a Listener, retrying while it does not exist yet (or refuses), up to
// `timeout`; then kTimeout naming the address. Other errors are kIoError at once. Errors
// and the channel name the listener "<role> at <address>".
Result<Channel> connect(const std::string& address, std::chrono::milliseconds timeout,
                        const std::string& role = "sender");

}  // namespace ferry::shm

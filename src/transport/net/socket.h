// The TCP socket a net peer authenticates over before UCX sees it (bootstrap.cc): an owned
// fd, and length-prefixed frames read into a bounded buffer.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/file_util.h"
#include "ferry/status.h"
#include "transport/net/address.h"

namespace ferry::net {

using ferry::ScopedFd;  // base/file_util.h

// A nonblocking, close-on-exec listening TCP socket with SO_REUSEADDR, so that a restarted
// server binds its port at once although connections of the last one are in TIME-WAIT.
Result<ScopedFd> listen_tcp(const SocketAddress& address, const std::string& text);
// The local address of a bound socket, e.g. "127.0.0.1:40123".
std::string local_address(int fd);
// Sets TCP_NODELAY: the handshake is small messages, each waited for.
void set_nodelay(int fd);

// Frames as on the UCX stream: a 4-byte little-endian length, then that many bytes.
std::vector<std::byte> frame(std::span<const std::byte> message);

// Reads frames from a nonblocking socket into a buffer that never holds more than
// 2 * (4 + max_bytes), so a peer cannot make us buffer more than that.
class FrameReader {
 public:
  // Reads what the socket has, up to the bound. OK with `*closed` set at EOF; kAborted
  // naming `peer` on a socket error.
  Status fill(int fd, std::size_t max_bytes, const std::string& peer, bool* closed);
  // The next whole frame, if buffered; kCorruption naming `peer` when its length exceeds
  // `max_bytes` (or is a FIN, which the handshake never has).
  Result<std::optional<std::vector<std::byte>>> next(std::size_t max_bytes,
                                                     const std::string& peer);
  std::size_t buffered() const { return buffer_.size(); }
  // The bytes read past the last frame taken: on ferry's TCP path the channel's first.
  std::vector<std::byte> take_rest() { return std::exchange(buffer_, {}); }

 private:
  std::vector<std::byte> buffer_;
};

// Blocking helpers for the connecting side: each waits at most until `deadline`.
using SteadyTime = std::chrono::steady_clock::time_point;
// Sends all of `bytes`; kAborted naming `peer` when the socket fails, kTimeout when the
// peer does not take them in time.
Status send_all(int fd, std::span<const std::byte> bytes, SteadyTime deadline,
                const std::string& peer);
// The next frame of at most `max_bytes`; kAborted when the peer closed, kTimeout.
Result<std::vector<std::byte>> read_frame(int fd, FrameReader& reader, std::size_t max_bytes,
                                          SteadyTime deadline, const std::string& peer);

}  // namespace ferry::net

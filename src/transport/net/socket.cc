#include "transport/net/socket.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ferry::net {
namespace {

constexpr std::size_t kFrameHeaderBytes = 4;

int millis_until(SteadyTime deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

}  // namespace

Result<ScopedFd> listen_tcp(const SocketAddress& address, const std::string& text) {
  ScopedFd fd(::socket(address.get()->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    return io_error(fmt::format("cannot listen on {}: socket: {}", text, std::strerror(errno)));
  }
  const int one = 1;
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), address.get(), address.length) != 0) {
    const int e = errno;
    return io_error(fmt::format("cannot listen on {}: bind: {}{}", text, std::strerror(e),
                                e == EADDRINUSE ? " (the port is in use)" : ""));
  }
  if (::listen(fd.get(), 128) != 0) {
    return io_error(fmt::format("cannot listen on {}: listen: {}", text, std::strerror(errno)));
  }
  return fd;
}

std::string local_address(int fd) {
  sockaddr_storage ss{};
  socklen_t length = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &length) != 0) return "?";
  return format_address(reinterpret_cast<const sockaddr*>(&ss));
}

void set_nodelay(int fd) {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::vector<std::byte> frame(std::span<const std::byte> message) {
  std::vector<std::byte> out(kFrameHeaderBytes + message.size());
  const auto length = static_cast<std::uint32_t>(message.size());
  for (std::size_t i = 0; i < kFrameHeaderBytes; ++i) {
    out[i] = static_cast<std::byte>(length >> (8 * i));
  }
  if (!message.empty()) std::memcpy(out.data() + kFrameHeaderBytes, message.data(), message.size());
  return out;
}

Status FrameReader::fill(int fd, std::size_t max_bytes, const std::string& peer, bool* closed) {
  *closed = false;
  const std::size_t limit = 2 * (kFrameHeaderBytes + max_bytes);
  while (buffer_.size() < limit) {
    std::byte chunk[4096];
    const std::size_t want = std::min(sizeof(chunk), limit - buffer_.size());
    const ssize_t n = ::recv(fd, chunk, want, MSG_DONTWAIT);
    if (n > 0) {
      buffer_.insert(buffer_.end(), chunk, chunk + n);
      continue;
    }
    if (n == 0) {
      *closed = true;
      return ok_status();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ok_status();
    return aborted(fmt::format("{} is gone: {}", peer, std::strerror(errno)));
  }
  return ok_status();
}

Result<std::optional<std::vector<std::byte>>> FrameReader::next(std::size_t max_bytes,
                                                                const std::string& peer) {
  if (buffer_.size() < kFrameHeaderBytes) return std::optional<std::vector<std::byte>>();
  std::uint32_t length = 0;
  for (std::size_t i = 0; i < kFrameHeaderBytes; ++i) {
    length |= std::uint32_t{static_cast<std::uint8_t>(buffer_[i])} << (8 * i);
  }
  if (length > max_bytes) {
    return corruption(fmt::format(
        "{} sent a handshake frame of {} bytes; the limit here is {} (not a ferry peer?)", peer,
        length, max_bytes));
  }
  if (buffer_.size() < kFrameHeaderBytes + length) return std::optional<std::vector<std::byte>>();
  const auto begin = buffer_.begin() + kFrameHeaderBytes;
  std::vector<std::byte> out(begin, begin + length);
  buffer_.erase(buffer_.begin(), begin + length);
  return std::optional<std::vector<std::byte>>(std::move(out));
}

Status send_all(int fd, std::span<const std::byte> bytes, SteadyTime deadline,
                const std::string& peer) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n =
        ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return aborted(fmt::format("{} is gone: {}", peer, std::strerror(errno)));
    }
    const int wait = millis_until(deadline);
    if (wait == 0) return timeout_error(fmt::format("{} did not take our message in time", peer));
    pollfd p{fd, POLLOUT, 0};
    (void)::poll(&p, 1, wait);
  }
  return ok_status();
}

Result<std::vector<std::byte>> read_frame(int fd, FrameReader& reader, std::size_t max_bytes,
                                          SteadyTime deadline, const std::string& peer) {
  while (true) {
    auto m = reader.next(max_bytes, peer);
    if (!m.ok()) return m.status();
    if (m->has_value()) return std::move(**m);
    bool closed = false;
    Status s = reader.fill(fd, max_bytes, peer, &closed);
    if (!s.ok()) return s;
    if (closed) {
      m = reader.next(max_bytes, peer);
      if (m.ok() && m->has_value()) return std::move(**m);
      return aborted(fmt::format("{} closed the connection", peer));
    }
    m = reader.next(max_bytes, peer);
    if (!m.ok()) return m.status();
    if (m->has_value()) return std::move(**m);
    const int wait = millis_until(deadline);
    if (wait == 0) return timeout_error(fmt::format("no answer from {} in time", peer));
    pollfd p{fd, POLLIN, 0};
    (void)::poll(&p, 1, wait);
  }
}

}  // namespace ferry::net

#include "transport/shm/message_channel.h"

#include <poll.h>

#include <cerrno>

namespace ferry::shm {

Status MessageChannel::send(std::span<const std::byte> message, std::chrono::milliseconds timeout) {
  return channel_.send(message, timeout);
}

Status MessageChannel::send_with_fd(std::span<const std::byte> message,
                                    std::chrono::milliseconds timeout, int fd) {
  return channel_.send(message, timeout, fd);
}

Result<std::vector<std::byte>> MessageChannel::receive(std::chrono::milliseconds timeout) {
  ScopedFd unused;
  return receive_with_fd(timeout, &unused);
}

Result<std::vector<std::byte>> MessageChannel::receive_with_fd(std::chrono::milliseconds timeout,
                                                               ScopedFd* fd) {
  auto got = channel_.receive(timeout);
  if (!got.ok()) return got.status();
  *fd = std::move(got->fd);
  return std::move(got->bytes);
}

Result<std::optional<std::vector<std::byte>>> MessageChannel::try_receive(
    std::chrono::milliseconds rest_within) {
  pollfd p{channel_.fd(), POLLIN, 0};
  const int ready = ::poll(&p, 1, 0);
  if (ready < 0 && errno != EINTR) return errno_status("poll", channel_.peer(), errno);
  if (ready <= 0) return std::optional<std::vector<std::byte>>();
  // Readable: a message (or the peer's close) is there; its later chunks follow at once
  // from a live peer.
  auto got = receive(rest_within);
  if (!got.ok()) return got.status();
  return std::optional<std::vector<std::byte>>(std::move(*got));
}

}  // namespace ferry::shm

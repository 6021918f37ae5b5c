#include "transport/shm/message_channel.h"

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

Result<std::optional<std::vector<std::byte>>> MessageChannel::try_receive() {
  return std::optional<std::vector<std::byte>>();  // polled on fd() instead
}

}  // namespace ferry::shm

#include "transport/shm/message_channel.h"

#include <fmt/format.h>
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

Result<std::size_t> MessageChannel::post(std::vector<std::byte> message) {
  if (message.size() > kMaxMessageBytes) {
    return invalid_argument(fmt::format("a message of {} bytes for {} exceeds the limit of {}",
                                        message.size(), peer(), kMaxMessageBytes));
  }
  posted_.push_back(std::move(message));
  return flush_posted();
}

Result<std::size_t> MessageChannel::flush_posted() {
  while (!posted_.empty()) {
    Status s = channel_.send(posted_.front(), std::chrono::milliseconds(0), -1, &front_sent_);
    if (s.code() == Code::kTimeout) break;  // the socket is full: the rest waits
    if (!s.ok()) return s;
    posted_.pop_front();
    front_sent_ = 0;
  }
  return posted_.size();
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

#include "sync/link.h"

namespace ferry::sync {

bool is_net_address(const std::string& address) {
  return !address.empty() && address[0] != '@' && address.find('/') == std::string::npos &&
         address.find(':') != std::string::npos;
}

Status Link::send(std::span<const std::byte> message, std::chrono::milliseconds timeout) {
  if (auto* s = std::get_if<shm::Channel>(&channel_)) return s->send(message, timeout);
  if (auto* n = std::get_if<net::Channel>(&channel_)) return n->send(message, timeout);
  return failed_precondition("send on a closed link");
}

Status Link::send_with_fd(std::span<const std::byte> message, std::chrono::milliseconds timeout,
                          int fd) {
  if (auto* s = std::get_if<shm::Channel>(&channel_)) return s->send(message, timeout, fd);
  return failed_precondition("only shm links pass descriptors");
}

Result<std::vector<std::byte>> Link::receive(std::chrono::milliseconds timeout) {
  if (auto* s = std::get_if<shm::Channel>(&channel_)) {
    auto got = s->receive(timeout);
    if (!got.ok()) return got.status();
    return std::move(got->bytes);
  }
  if (auto* n = std::get_if<net::Channel>(&channel_)) return n->receive(timeout);
  return failed_precondition("receive on a closed link");
}

Result<std::vector<std::byte>> Link::receive_with_fd(std::chrono::milliseconds timeout,
                                                     ScopedFd* fd) {
  if (auto* s = std::get_if<shm::Channel>(&channel_)) {
    auto got = s->receive(timeout);
    if (!got.ok()) return got.status();
    *fd = std::move(got->fd);
    return std::move(got->bytes);
  }
  return receive(timeout);
}

Result<std::optional<std::vector<std::byte>>> Link::try_receive() {
  if (auto* n = std::get_if<net::Channel>(&channel_)) return n->try_receive();
  return std::optional<std::vector<std::byte>>();
}

int Link::fd() const {
  if (const auto* s = std::get_if<shm::Channel>(&channel_)) return s->fd();
  if (const auto* n = std::get_if<net::Channel>(&channel_)) return n->fd();
  return -1;
}

bool Link::valid() const {
  if (const auto* s = std::get_if<shm::Channel>(&channel_)) return s->valid();
  if (const auto* n = std::get_if<net::Channel>(&channel_)) return n->valid();
  return false;
}

void Link::close() {
  if (auto* s = std::get_if<shm::Channel>(&channel_)) s->close();
  if (auto* n = std::get_if<net::Channel>(&channel_)) n->close();
}

void Link::abort() {
  if (auto* s = std::get_if<shm::Channel>(&channel_)) s->close();
  if (auto* n = std::get_if<net::Channel>(&channel_)) n->abort();
}

const std::string& Link::peer() const {
  if (const auto* s = std::get_if<shm::Channel>(&channel_)) return s->peer();
  if (!net_peer_.empty()) return net_peer_;
  if (const auto* n = std::get_if<net::Channel>(&channel_)) return n->peer();
  return net_peer_;
}

void Link::set_peer(std::string peer) {
  if (auto* s = std::get_if<shm::Channel>(&channel_)) {
    s->set_peer(std::move(peer));
  } else {
    net_peer_ = std::move(peer);
  }
}

}  // namespace ferry::sync

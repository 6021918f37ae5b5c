#include "sync/link.h"

#include <fmt/format.h>

#include "sync/sync_options.h"

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

Result<net::Token> session_token(const SyncOptions& options) {
  auto token = options.token_file.empty() ? net::Token::from_env()
                                          : net::Token::from_file(options.token_file);
  if (!token.ok() && token.status().code() == Code::kNotFound && options.token_file.empty()) {
    return Status(Code::kUnauthenticated,
                  "a net session needs its secret: set FERRY_TOKEN, or FERRY_TOKEN_FILE (or "
                  "--token-file) to a file of mode 0600 holding it, the same on every node");
  }
  return token;
}

Result<Link> connect_upstream(const std::string& address, const SyncOptions& options,
                              std::shared_ptr<net::Context>* context) {
  if (!is_net_address(address)) {
    // No sender listening yet is retried until the timeout, in slices so Ctrl-C is heard.
    auto ch = retry_in_slices(
        options, options.timeout, "no sender listening at " + address,
        [&](std::chrono::milliseconds slice) { return shm::connect(address, slice); });
    if (!ch.ok()) return ch.status();
    return Link(std::move(*ch));
  }
  auto token = session_token(options);
  if (!token.ok()) return token.status();
  auto ctx = net::Context::create();
  if (!ctx.ok()) return ctx.status();
  *context = std::move(*ctx);
  auto ch = net::connect(*context, address, *token, options.timeout);
  if (!ch.ok()) return ch.status();
  // The sender chooses how its bulk bytes travel; this end only sets the least it takes.
  ch->set_bulk_protection(WireProtect::kNone, options.wire_protect);
  return Link(std::move(*ch));
}

Result<wire::Message> decode_from_sender(std::span<const std::byte> bytes, const Link& link,
                                         wire::Conversation& conversation) {
  auto m = wire::decode(bytes, link.peer());
  if (!m.ok()) return m.status();
  Status s = conversation.received(*m);
  if (!s.ok()) return s;
  if (m->type() == wire::MessageType::kError) {
    const auto& e = std::get<wire::Error>(m->body);
    return aborted(fmt::format("{} aborted the session: {}", link.peer(), e.message));
  }
  return m;
}

Status receive_segment(Link& link, std::uint32_t key, std::span<std::byte> into,
                       const net::MemoryRegion& region, std::chrono::milliseconds timeout) {
  auto t = link.net().receive_bulk(key, into, region);
  if (!t.ok()) return t.status();
  Status s = link.net().wait(*t, timeout);
  if (!s.ok()) return s;
  if (t->bytes() != into.size()) {
    return corruption(fmt::format("{} sent {} bytes for a segment of {}", link.peer(),
                                  t->bytes(), into.size()));
  }
  return ok_status();
}

}  // namespace ferry::sync

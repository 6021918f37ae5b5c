#include "sync/link.h"

#include <fmt/format.h>

#include "base/status_macros.h"
#include "sync/sync_options.h"
#include "transport/connect.h"
#include "transport/net/message_channel.h"
#include "transport/shm/message_channel.h"

namespace ferry::sync {

static_assert(wire::kHeaderBytes + wire::kMaxBodyBytes <= transport::kMaxMessageBytes,
              "the largest wire message must fit every transport");

namespace {
const std::string kNoPeer;
}  // namespace

Link::Link(std::unique_ptr<transport::Channel> channel) : channel_(std::move(channel)) {
  if (auto* n = dynamic_cast<net::MessageChannel*>(channel_.get())) net_ = &n->net();
}
Link::Link(shm::Channel c) : Link(std::make_unique<shm::MessageChannel>(std::move(c))) {}
Link::Link(net::Channel c) : Link(std::make_unique<net::MessageChannel>(std::move(c))) {}

Status Link::send(std::span<const std::byte> message, std::chrono::milliseconds timeout) {
  if (!channel_) return failed_precondition("send on a closed link");
  return channel_->send(message, timeout);
}

Status Link::send_with_fd(std::span<const std::byte> message, std::chrono::milliseconds timeout,
                          int fd) {
  if (!channel_) return failed_precondition("send on a closed link");
  return channel_->send_with_fd(message, timeout, fd);
}

Result<std::vector<std::byte>> Link::receive(std::chrono::milliseconds timeout) {
  if (!channel_) return failed_precondition("receive on a closed link");
  return channel_->receive(timeout);
}

Result<std::vector<std::byte>> Link::receive_with_fd(std::chrono::milliseconds timeout,
                                                     ScopedFd* fd) {
  if (!channel_) return failed_precondition("receive on a closed link");
  return channel_->receive_with_fd(timeout, fd);
}

Result<std::optional<std::vector<std::byte>>> Link::try_receive() {
  if (!channel_) return std::optional<std::vector<std::byte>>();
  return channel_->try_receive();
}

void Link::close() {
  if (channel_) channel_->close();
}

void Link::abort() {
  if (channel_) channel_->abort();
}

const std::string& Link::peer() const { return channel_ ? channel_->peer() : kNoPeer; }

void Link::set_peer(std::string peer) {
  if (channel_) channel_->set_peer(std::move(peer));
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
  if (!transport::is_net_address(address)) {
    // No sender listening yet is retried until the timeout, in slices so Ctrl-C is heard.
    FERRY_ASSIGN_OR_RETURN(
        auto channel, retry_in_slices(options, options.timeout, "no sender listening at " + address,
                                      [&](std::chrono::milliseconds slice) {
                                        return transport::connect(address, slice);
                                      }));
    return Link(std::move(channel));
  }
  transport::NetConnectOptions net;
  FERRY_ASSIGN_OR_RETURN(net.token, session_token(options));
  FERRY_ASSIGN_OR_RETURN(net.context, net::Context::create());
  *context = net.context;
  FERRY_ASSIGN_OR_RETURN(auto channel, transport::connect(address, options.timeout, net));
  Link link(std::move(channel));
  // The sender chooses how its bulk bytes travel; this end only sets the least it takes.
  link.net()->set_bulk_protection(WireProtect::kNone, options.wire_protect);
  return link;
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
  if (link.net() == nullptr) {
    return internal_error("receive_segment on a link to " + link.peer() + " that shares memory");
  }
  auto t = link.net()->receive_bulk(key, into, region);
  if (!t.ok()) return t.status();
  Status s = link.net()->wait(*t, timeout);
  if (!s.ok()) return s;
  if (t->bytes() != into.size()) {
    return corruption(
        fmt::format("{} sent {} bytes for a segment of {}", link.peer(), t->bytes(), into.size()));
  }
  return ok_status();
}

}  // namespace ferry::sync

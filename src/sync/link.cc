#include "sync/link.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/clock.h"
#include "base/status_macros.h"
#include "sync/sync_options.h"

namespace ferry::sync {

static_assert(wire::kHeaderBytes + wire::kMaxBodyBytes <= transport::kMaxMessageBytes,
              "the largest wire message must fit every transport");

namespace {
const std::string kNoPeer;
}  // namespace

Link::Link(std::unique_ptr<transport::Channel> channel) : channel_(std::move(channel)) {}

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

Result<std::optional<std::vector<std::byte>>> Link::try_receive(
    std::chrono::milliseconds rest_within) {
  if (!channel_) return std::optional<std::vector<std::byte>>();
  return channel_->try_receive(rest_within);
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

wire::Message session_message(std::uint64_t session, std::uint64_t round, wire::Body body) {
  wire::Message m;
  m.session = session;
  m.round = round;
  m.body = std::move(body);
  return m;
}

transport::TransportConfig transport_config(const SyncOptions& options) {
  return {.secret_file = options.token_file, .protection = options.wire_protect};
}

Result<Link> connect_upstream(const std::string& address, const SyncOptions& options,
                              transport::Registry& transports) {
  FERRY_ASSIGN_OR_RETURN(transport::Transport * transport, transports.for_address(address));
  if (!transport->connect_in_slices()) {
    FERRY_ASSIGN_OR_RETURN(auto channel, transport->connect(address, options.timeout));
    return Link(std::move(channel));
  }
  FERRY_ASSIGN_OR_RETURN(
      auto channel, retry_in_slices(options, options.timeout, "no sender listening at " + address,
                                    [&](std::chrono::milliseconds slice) {
                                      return transport->connect(address, slice);
                                    }));
  return Link(std::move(channel));
}

Result<std::vector<std::byte>> receive_heeding_interrupt(Link& link,
                                                         std::chrono::milliseconds timeout,
                                                         const SyncOptions& options,
                                                         InterruptCheck& interrupted) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto left =
        timeout.count() < 0
            ? timeout
            : std::max(
                  std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    const auto slice = wait_slice(options, left);
    auto got = link.receive(slice);
    if (got.ok() || got.status().code() != Code::kTimeout || !options.interrupt) return got;
    if (slice == left) {  // the whole timeout passed: say so, not the last slice
      return timeout_error(
          fmt::format("no message from {} within {} ms", link.peer(), timeout.count()));
    }
    FERRY_RETURN_IF_ERROR(interrupted());
  }
}

Result<wire::Message> decode_from_sender(std::span<const std::byte> bytes, const Link& link,
                                         wire::Conversation& conversation, bool* sender_error) {
  auto m = wire::decode(bytes, link.peer());
  if (!m.ok()) return m.status();
  Status s = conversation.received(*m);
  if (!s.ok()) return s;
  if (m->type() == wire::MessageType::kError) {
    const auto& e = std::get<wire::Error>(m->body);
    if (sender_error != nullptr) *sender_error = true;
    return aborted(fmt::format("{} aborted the session: {}", link.peer(), e.message));
  }
  return m;
}

}  // namespace ferry::sync

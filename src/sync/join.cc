#include "sync/join.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "base/clock.h"
#include "base/status_macros.h"
#include "sync/link.h"
#include "wire/conversation.h"
#include "wire/message.h"

namespace ferry::sync {

namespace {

// A link that said HELLO and holds the sender's answer (and, from a sender sharing memory,
// the ring's descriptor).
struct Answered {
  Link link;
  std::vector<std::byte> answer;
  ScopedFd ring_fd;
};

// *cut_off: the sender's end closed before it answered (not an interrupt, not a refusal).
Result<Answered> say_hello(const std::string& address, const JoinAs& as, const SyncOptions& options,
                           transport::Registry& transports, bool* cut_off) {
  FERRY_ASSIGN_OR_RETURN(Link link, connect_upstream(address, options, transports));
  wire::Message hello;
  hello.session = as.session;
  hello.body = wire::Hello{as.id, static_cast<std::uint32_t>(::getpid())};
  Status sent = link.send(wire::encode(hello), options.timeout);
  *cut_off = sent.code() == Code::kAborted;
  FERRY_RETURN_IF_ERROR(sent);
  // A sender that is up but not yet in accept() answers later: wait in slices (Ctrl-C).
  ScopedFd ring_fd;
  auto got = retry_in_slices(options, options.timeout, "no answer from " + link.peer(),
                             [&](std::chrono::milliseconds slice) {
                               auto r = link.receive_with_fd(slice, &ring_fd);
                               *cut_off = !r.ok() && r.status().code() == Code::kAborted;
                               return r;
                             });
  if (!got.ok()) return got.status().with_context("waiting for WELCOME");
  return Answered{std::move(link), std::move(*got), std::move(ring_fd)};
}

// Says HELLO until a sender answers, within options.timeout. A session that closes before it
// answers (its sender is starting a new one at the same address: verl's ranks rebuild their
// sessions side by side) is tried again, so a caller joining several senders keeps the ones
// it joined.
Result<Answered> hello_until_answered(const std::string& address, const JoinAs& as,
                                      const SyncOptions& options, transport::Registry& transports) {
  const Deadline deadline(options.timeout);
  InterruptCheck interrupted(options);
  SyncOptions attempt = options;  // the first has the whole timeout (its errors name it)
  while (true) {
    bool cut_off = false;
    auto answered = say_hello(address, as, attempt, transports, &cut_off);
    if (answered.ok() || !cut_off || deadline.passed()) return answered;
    FERRY_RETURN_IF_ERROR(interrupted());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    attempt.timeout = std::max(deadline.left(), std::chrono::milliseconds(1));
  }
}

}  // namespace

Result<std::unique_ptr<RoundReader>> join_session(const std::string& address, const JoinAs& as,
                                                  const SyncOptions& options) {
  if (options.timeout.count() <= 0) return invalid_argument("timeout must be positive");
  transport::Registry own(transport_config(options));
  transport::Registry& transports = as.transports != nullptr ? *as.transports : own;
  FERRY_ASSIGN_OR_RETURN(transport::Transport * transport, transports.for_address(address));
  FERRY_ASSIGN_OR_RETURN(Answered answered, hello_until_answered(address, as, options, transports));
  Link& link = answered.link;
  wire::Conversation conversation(wire::Conversation::Role::kReceiver, link.peer(), as.session);
  FERRY_ASSIGN_OR_RETURN(wire::Message m, wire::decode(answered.answer, link.peer()));
  FERRY_RETURN_IF_ERROR(conversation.received(m));
  if (m.type() == wire::MessageType::kError) {
    const auto& e = std::get<wire::Error>(m.body);
    return Status(e.code,
                  fmt::format("{} turned {} {} away: {}", link.peer(), as.noun, as.id, e.message));
  }
  const auto& w = std::get<wire::Welcome>(m.body);
  std::unique_ptr<transport::Ring> ring;
  std::unique_ptr<transport::Region> region;
  if (!link.shares_memory()) {
    // The ring's size is the sender's to choose: bounded before any of it is allocated.
    FERRY_RETURN_IF_ERROR(check_ring_size(
        options, link.peer(), fmt::format("{} {}", as.noun, as.id), w.slots, w.slot_bytes));
    FERRY_ASSIGN_OR_RETURN(ring, transport->allocate_ring(w.slots, w.slot_bytes));
    FERRY_ASSIGN_OR_RETURN(region, link.channel().register_memory(ring->memory()));
  } else {
    if (!answered.ring_fd.valid()) {
      return corruption(fmt::format("WELCOME from {} carried no ring descriptor", link.peer()));
    }
    FERRY_ASSIGN_OR_RETURN(ring, transport->map_peer_ring(std::move(answered.ring_fd), w.slots,
                                                          w.slot_bytes, link.peer()));
  }
  return std::make_unique<RoundReader>(options, std::move(link), std::move(conversation),
                                       std::move(ring), std::move(region), w.checksums != 0);
}

}  // namespace ferry::sync

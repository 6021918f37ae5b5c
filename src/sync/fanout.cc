#include "sync/fanout.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "base/clock.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace ferry::sync {

using std::chrono::milliseconds;

Result<std::unique_ptr<Fanout>> Fanout::create(const std::string& address,
                                               const SyncOptions& options, std::uint32_t slots,
                                               std::uint64_t slot_bytes) {
  auto f = std::make_unique<Fanout>();
  f->options_ = options;
  f->interrupted_ = InterruptCheck(options);
  transport::Registry transports(transport_config(options));
  FERRY_ASSIGN_OR_RETURN(transport::Transport * transport, transports.for_address(address));
  FERRY_ASSIGN_OR_RETURN(f->listener_, transport->listen(address));
  f->address_ = f->listener_->address();
  f->poller_ = f->listener_->poller();
  FERRY_ASSIGN_OR_RETURN(f->owned_ring_, transport->allocate_ring(slots, slot_bytes));
  f->ring_ = f->owned_ring_.get();
  FERRY_ASSIGN_OR_RETURN(f->ring_region_, f->listener_->register_memory(f->ring_->memory()));
  return f;
}

Result<std::unique_ptr<Fanout>> Fanout::create_over(const std::string& address,
                                                    const SyncOptions& options,
                                                    transport::Ring* ring,
                                                    transport::Registry& transports) {
  auto f = std::make_unique<Fanout>();
  f->options_ = options;
  f->interrupted_ = InterruptCheck(options);
  FERRY_ASSIGN_OR_RETURN(f->listener_, transports.listen(address));
  f->address_ = f->listener_->address();
  f->poller_ = f->listener_->poller();
  f->ring_ = ring;
  FERRY_ASSIGN_OR_RETURN(f->ring_region_, f->listener_->register_memory(ring->memory()));
  return f;
}

wire::Message Fanout::message(wire::Body body) const {
  return session_message(session_, round_, std::move(body));
}

// A peer that gave up sends ERROR and closes; our next send may then fail before we read
// the ERROR. Prefer the peer's own reason when it is waiting.
Status Fanout::explain_send_failure(Peer& p, Status failed) {
  auto got = p.link.receive(milliseconds(0));
  if (got.ok()) {
    auto m = wire::decode(*got, p.link.peer());
    if (m.ok() && m->type() == wire::MessageType::kError) {
      const auto& e = std::get<wire::Error>(m->body);
      return Status(e.code,
                    fmt::format("{} gave up on round {}: {}", p.link.peer(), round_, e.message));
    }
  }
  return peer_error(p, failed);
}

bool Fanout::all_peers_share_memory() const {
  return std::all_of(peers_.begin(), peers_.end(),
                     [](const Peer& p) { return p.link.shares_memory(); });
}

// Net transport errors name only the address ("peer 10.0.0.2:4100 is gone"); shm ones name
// the peer as admit() called it. Either way the error says which peer, by id.
Status Fanout::peer_error(const Peer& p, const Status& s) const {
  if (s.message().find(p.link.peer()) != std::string::npos) {
    return Status(s.code(), fmt::format("round {}: {}", round_, s.message()));
  }
  return Status(s.code(), fmt::format("round {}: {}: {}", round_, p.link.peer(), s.message()));
}

Status Fanout::send_all(const wire::Message& m) { return send_all_bytes(wire::encode(m), m); }

Status Fanout::send_all_bytes(const std::vector<std::byte>& bytes, const wire::Message& m) {
  const auto* filled = std::get_if<wire::Filled>(&m.body);
  for (Peer& p : peers_) {
    Status s = p.link.send(bytes, options_.timeout);
    if (!s.ok()) return explain_send_failure(p, s);
    p.conversation.sent(m);
    if (filled != nullptr && !p.link.shares_memory() && filled->used_bytes > filled->offset) {
      // The segment's bytes follow their FILLED, straight from the ring.
      const std::span<const std::byte> bytes_of_segment(ring_->slot(filled->slot) + filled->offset,
                                                        filled->used_bytes - filled->offset);
      s = p.link.channel().publish_segment(bytes_of_segment, ring_region_.get());
      if (!s.ok()) return peer_error(p, s);
    }
  }
  return ok_status();
}

Status Fanout::fail(Status why) {
  const auto bytes = wire::encode(message(wire::Error{why.code(), why.message()}));
  for (Peer& p : peers_) {
    if (p.link.valid()) (void)p.link.send(bytes, milliseconds(100));
    p.link.abort();  // also cancels the segment sends still in flight
  }
  return why;
}

Status Fanout::handle(Peer& p, const wire::Message& m, std::uint64_t round_checksum) {
  Status s = p.conversation.received(m);
  if (!s.ok()) return s;
  switch (m.type()) {
    case wire::MessageType::kRelease:
      ++p.released;
      return ok_status();
    case wire::MessageType::kAck: {
      const auto& a = std::get<wire::Ack>(m.body);
      if (a.round_checksum != round_checksum) {
        return corruption(
            fmt::format("{} acknowledged round {} with checksum {:016x}, the "
                        "sender's is {:016x}",
                        p.link.peer(), round_, a.round_checksum, round_checksum));
      }
      p.acked = true;
      return ok_status();
    }
    case wire::MessageType::kError: {
      const auto& e = std::get<wire::Error>(m.body);
      return Status(e.code,
                    fmt::format("{} gave up on round {}: {}", p.link.peer(), round_, e.message));
    }
    default:
      return internal_error("unexpected message passed the conversation check");
  }
}

// Finished segment sends are forgotten; a failed one means the peer is gone.
Status Fanout::reap(Peer& p) {
  Status s = p.link.channel().check_segments();
  if (!s.ok()) return peer_error(p, s);
  return ok_status();
}

Status Fanout::keep_moving() {
  poller_->progress();
  for (Peer& p : peers_) {
    if (!p.link.shares_memory()) FERRY_RETURN_IF_ERROR(reap(p));
  }
  return ok_status();
}

Result<bool> Fanout::handle_arrived(const std::function<bool(const Peer&)>& done,
                                    std::uint64_t round_checksum) {
  bool any = false;
  for (Peer& p : peers_) {
    // What a peer said comes before what its link's state implies: a relay reports the
    // receiver that failed behind it, then leaves, failing our segment sends to it; a peer
    // that sent its last message (an ACK) and ended fails the sends UCX had not yet reported
    // done, and that ACK must still count. A peer this wait does not need is read too, so
    // its report is heard now, not after it left.
    const bool needed = !done(p);
    auto got = p.link.try_receive(options_.timeout);
    if (!got.ok() && needed) return peer_error(p, got.status());
    if (got.ok() && got->has_value()) {
      auto m = wire::decode(**got, p.link.peer());
      if (!m.ok()) return m.status();
      Status s = handle(p, *m, round_checksum);
      any = true;
      // A peer this wait does not need that gave up waiting for us is a symptom of the peer
      // we are blocked on, which this wait names when it ends; anything else is news.
      if (!s.ok() && (needed || s.code() != Code::kTimeout)) return s;
    }
    if (done(p) || p.link.shares_memory()) continue;  // no segment sends to reap
    Status s = reap(p);
    if (!s.ok()) return s;
  }
  return any;
}

Status Fanout::wait_until(const std::function<bool(const Peer&)>& peer_done,
                          std::uint64_t round_checksum, const char* waiting_for) {
  auto done = [&] {
    for (const Peer& p : peers_) {
      if (!peer_done(p)) return false;
    }
    return true;
  };
  std::vector<pollfd> fds;
  auto deadline = Clock::now() + options_.timeout;
  while (!done()) {
    poller_->progress();
    auto heard = handle_arrived(peer_done, round_checksum);
    if (!heard.ok()) return heard.status();
    if (*heard) {
      deadline = Clock::now() + options_.timeout;  // the timeout is per silence
      continue;
    }
    fds.clear();
    add_poll_fds(peer_done, &fds);
    const auto left = std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()),
                               milliseconds(0));
    auto ready = poller_->wait(fds, wait_slice(options_, left));
    if (!ready.ok()) return ready.status();
    if (*ready == 0) {
      Status s = interrupted_();
      if (!s.ok()) return s;
    }
    if (*ready > 0) continue;  // read at the loop's head, before the deadline is looked at
    // Checked whether poll() timed out or woke: UCX's event fd may wake us again and again
    // for a peer that says nothing (a cut link), which must not keep the round alive.
    if (Clock::now() >= deadline) {
      std::string slow;
      for (const Peer& p : peers_) {
        if (!peer_done(p)) slow += (slow.empty() ? "" : ", ") + p.link.peer();
      }
      return timeout_error(
          fmt::format("round {}: no word from the {}s ({}) for {} ms "
                      "while waiting for {}",
                      round_, noun_, slow, options_.timeout.count(), waiting_for));
    }
  }
  return ok_status();
}

void Fanout::add_poll_fds(const std::function<bool(const Peer&)>& done,
                          std::vector<pollfd>* fds) const {
  // Only peers still owing something: one that acknowledged and exited is not a failure.
  for (const Peer& p : peers_) {
    fds->push_back({done(p) ? -1 : p.link.poll_fd(), POLLIN, 0});
  }
}

Status Fanout::drain_transfers() {
  // One deadline for all peers: N slow peers must not add up to N timeouts.
  const Deadline deadline(options_.timeout);
  for (Peer& p : peers_) {
    if (p.link.shares_memory()) continue;
    Status s = p.link.channel().await_segments(deadline.left());
    // A peer that acknowledged the round holds every segment (its ACK's checksum covers
    // them); if it ended since, the sends UCX had not reported done fail, which fails no
    // round: its end fails the next one.
    if (!s.ok() && p.acked && s.code() == Code::kAborted) continue;
    if (!s.ok()) return peer_error(p, s);
  }
  return ok_status();
}

Status Fanout::accept(std::uint32_t n) {
  const std::size_t before = peers_.size();
  while (peers_.size() - before < n) {
    Status s = accept_one();
    drop_peers_that_left(before);
    if (s.ok()) continue;
    const std::size_t joined = peers_.size() - before;
    if (s.code() != Code::kTimeout || joined == 0) return s;
    // Some joined: say who, so a user looks for the missing ones, not for a dead sender.
    std::vector<std::string> names;
    for (std::size_t k = before; k < peers_.size(); ++k) names.push_back(peers_[k].link.peer());
    return timeout_error(fmt::format("only {} of {} {}s joined {} within {} ms (joined: {})",
                                     joined, n, noun_, address_, options_.timeout.count(),
                                     fmt::join(names, ", ")));
  }
  return ok_status();
}

namespace {

// Whether the peer's end of a link with a descriptor of its own (shm) has closed; false where
// the transport's engine reports it (net): a round then finds the peer gone.
bool hung_up(const Peer& p) {
  pollfd fd{p.link.poll_fd(), POLLIN, 0};
  if (fd.fd < 0) return false;
  return ::poll(&fd, 1, 0) == 1 && (fd.revents & (POLLHUP | POLLERR)) != 0;
}

}  // namespace

// A receiver that joined and left before its first round (a rank whose join of another
// sender failed, and which tries again) does not count as joined, and may join again.
void Fanout::drop_peers_that_left(std::size_t from) {
  for (auto it = peers_.begin() + static_cast<std::ptrdiff_t>(from); it != peers_.end();) {
    if (!hung_up(*it)) {
      ++it;
      continue;
    }
    log::info("sync: {} left before its first round; it may join again", it->link.peer());
    it = peers_.erase(it);
  }
}

Status Fanout::accept_one() {
  const auto deadline = Clock::now() + options_.timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return timeout_error(
          fmt::format("no {} joined {} within {} ms", noun_, address_, options_.timeout.count()));
    }
    FERRY_ASSIGN_OR_RETURN(const bool admitted, admit_pending(wait_slice(options_, left)));
    if (admitted) return ok_status();
    FERRY_RETURN_IF_ERROR(interrupted_());
  }
}

// Peers that connected but have not said HELLO yet wait side by side, each with its own
// deadline, so a silent one delays nobody; a peer the listener refused (another user, a
// wrong token) never gets here.
Result<bool> Fanout::admit_pending(milliseconds wait) {
  auto now = Clock::now();
  std::erase_if(pending_, [&](const PendingPeer& q) {
    if (q.deadline > now) return false;
    log::warn("sync: dropped {}: it connected but sent no HELLO within {} ms", q.link.peer(),
              options_.timeout.count());
    return true;
  });
  poller_->progress();
  while (true) {  // every connection that is ready now
    auto ch = listener_->accept(milliseconds(0));
    if (!ch.ok() && ch.status().code() == Code::kTimeout) break;
    if (!ch.ok()) return ch.status();
    if (pending_.size() >= kMaxPendingPeers) {
      log::warn("sync: dropped {}: {} connections already wait to say HELLO",
                pending_.front().link.peer(), kMaxPendingPeers);
      pending_.erase(pending_.begin());
    }
    pending_.push_back({Link(std::move(*ch)), Clock::now() + options_.timeout});
  }
  // Oldest first: they connected earlier.
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto got = it->link.try_receive(options_.timeout);
    if (got.ok() && !got->has_value()) {
      ++it;
      continue;
    }
    Peer p;
    p.link = std::move(it->link);
    it = pending_.erase(it);
    if (!got.ok()) {  // one that connects and leaves is no reason to stop serving
      log::warn("sync: dropped {} before it joined: {}", p.link.peer(), got.status().message());
      continue;
    }
    if (admit(std::move(p), **got).ok()) return true;
  }
  // Sleep until a connection or a HELLO comes, a pending peer's deadline, or `wait`.
  now = Clock::now();
  auto until = now + wait;
  std::vector<pollfd> fds{{listener_->fd(), POLLIN, 0}};
  for (const PendingPeer& q : pending_) {
    fds.push_back({q.link.poll_fd(), POLLIN, 0});
    until = std::min(until, q.deadline);
  }
  const auto left = std::chrono::duration_cast<milliseconds>(until - now) + milliseconds(1);
  FERRY_RETURN_IF_ERROR(poller_->wait(fds, std::max(left, milliseconds(0))).status());
  return false;
}

// Checks a joining peer's HELLO and answers WELCOME (with the read-only ring for shm), or
// turns it away with an ERROR; either way serving goes on.
Status Fanout::admit(Peer p, const std::vector<std::byte>& hello) {
  p.conversation = wire::Conversation(wire::Conversation::Role::kSender, "", session_);
  auto m = wire::decode(hello, p.link.peer());
  Status s = m.ok() ? p.conversation.received(*m) : m.status();
  std::uint32_t id = 0;
  if (s.ok()) {
    const auto& h = std::get<wire::Hello>(m->body);
    id = h.receiver_id;
    std::string where = p.link.peer_address();
    if (!where.empty()) where = " at " + where;
    p.link.set_peer(fmt::format("{} {}{} (pid {})", noun_, id, where, h.pid));
    // An id whose holder has left (a rank joining again) is this peer's.
    const auto holder =
        std::find_if(peers_.begin(), peers_.end(), [&](const Peer& q) { return q.id == id; });
    if (holder != peers_.end() && hung_up(*holder)) {
      log::info("sync: {} left; {} takes its place", holder->link.peer(), p.link.peer());
      peers_.erase(holder);
    } else if (holder != peers_.end()) {
      s = already_exists(fmt::format("{} id {} already joined", noun_, id));
    }
  }
  if (!s.ok()) {
    // Turned away, not consumed: it hears why and the session goes on.
    (void)p.link.send(wire::encode(message(wire::Error{s.code(), s.message()})), milliseconds(100));
    return s;
  }
  p.id = id;
  p.conversation = wire::Conversation(wire::Conversation::Role::kSender, p.link.peer(), session_);
  (void)p.conversation.received(*m);
  const wire::Message welcome = message(wire::Welcome{
      ring_->slots(), ring_->slot_bytes(), static_cast<std::uint8_t>(options_.checksums ? 1 : 0)});
  // A peer that shares memory maps the ring from the descriptor passed with WELCOME.
  s = p.link.passes_fds()
          ? p.link.send_with_fd(wire::encode(welcome), options_.timeout, ring_->share_fd())
          : p.link.send(wire::encode(welcome), options_.timeout);
  if (!s.ok()) return s;
  p.conversation.sent(welcome);
  const std::string transports = p.link.transports();
  if (!transports.empty()) log::info("sync: {} joined over {}", p.link.peer(), transports);
  peers_.push_back(std::move(p));
  return ok_status();
}

}  // namespace ferry::sync

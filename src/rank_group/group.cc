// RankGroup over the transport seam (transport/transport.h): one implementation for ranks
// on one machine (shm: "@name" addresses, peers of this user only) and on any machines
// (net: "host:port", peers with the session token), picked by address through the
// transport Registry. Messages: rank_group/messages.h; protocol: docs/protocol.md, "Rank
// groups".
//
// A transport's channels are used by one thread at a time, so each rank has two sides,
// each with its own Registry (net: its own UCX Context):
// - the calling side (`calls_`): the channels of the collectives (a star through rank 0)
//   and of this rank's fetches. Callers' threads take turns on it under call_mu_.
// - the serving side (`serve_`): owned by one thread that accepts the others' fetch
//   channels and answers each request with the installed handler. It never waits on a
//   caller, so a rank keeps answering while it sits in a collective.
#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <list>
#include <map>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/random.h"
#include "base/serving_threads.h"
#include "base/status_macros.h"
#include "rank_group/constants.h"
#include "rank_group/group_base.h"
#include "rank_group/messages.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace ferry::rank_group {
namespace {

using msg::Kind;
using std::chrono::milliseconds;
using transport::Channel;

// What both public options say, and how this rank reaches the others.
struct GroupOptions {
  std::string root_address;
  int rank = 0;
  int size = 1;
  std::string node;
  std::string serve_address;  // where this rank serves fetches
  std::string secret;         // net: the session token ("": the environment's)
  milliseconds timeout{0};
  milliseconds collective_timeout{0};
};

// Sleeps until one of `channels` (or `extra_fd`) may have news, at most `left` and
// kIdleWait, so that a missed wakeup costs little.
void idle(transport::Poller& poller, const std::vector<const Channel*>& channels, int extra_fd,
          milliseconds left) {
  std::vector<pollfd> fds{{extra_fd, POLLIN, 0}};
  for (const Channel* ch : channels) {
    if (ch != nullptr && ch->poll_fd() >= 0) fds.push_back({ch->poll_fd(), POLLIN, 0});
  }
  (void)poller.wait(fds, std::clamp(left, milliseconds(0), kIdleWait));
}

// A refused joiner, for the join's timeout error: the first kMaxRefusals.
void note_refusal(std::vector<std::string>& refused, std::string why) {
  if (refused.size() < kMaxRefusals) refused.push_back(std::move(why));
}

Status send_blob(Channel& ch, Kind kind, std::uint64_t seq, std::string_view data,
                 const Deadline& dl) {
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(msg::kBlobChunkBytes, data.size() - at);
    FERRY_RETURN_IF_ERROR(
        ch.send(msg::encode_blob_chunk(kind, seq, data.size(), data.substr(at, n)), dl.left()));
    at += n;
  } while (at < data.size());
  return ok_status();
}

// shm answers travel in pieces through a window (docs/protocol.md): piece k is bytes
// [k * kAnswerSlotBytes, ...) of the answer, in slot k % kAnswerSlots.
std::uint64_t piece_count(std::size_t bytes) {
  return (bytes + kAnswerSlotBytes - 1) / kAnswerSlotBytes;
}
template <typename T>
std::span<T> piece_of(std::span<T> bytes, std::uint64_t k) {
  const std::uint64_t at = k * kAnswerSlotBytes;
  return bytes.subspan(at, std::min<std::uint64_t>(kAnswerSlotBytes, bytes.size() - at));
}

// Receives the PIECE (fetcher) or TAKEN (server) of piece k of answer `id`, in slices: a
// closing group does not wait for a peer that stalls.
Status receive_piece(Channel& ch, Kind kind, std::uint32_t id, std::uint64_t k, const Deadline& dl,
                     const std::atomic<bool>& stop) {
  const bool taken = kind == Kind::kTaken;
  Result<std::vector<std::byte>> m = timeout_error("");
  do {
    if (stop.load()) return aborted("the checkpoint group is closing");
    m = ch.receive(std::min(dl.left(), kIdleWait));
  } while (!m.ok() && m.status().code() == Code::kTimeout && !dl.passed());
  if (!m.ok()) {
    return m.status().with_context("waiting for " + ch.peer() + (taken ? " to take" : " to send") +
                                   " a piece");
  }
  auto piece = msg::decode_piece(*m, kind);
  if (!piece.ok()) return piece.status().with_context(ch.peer());
  if (piece->id != id || piece->index != k) {
    return corruption(fmt::format("{} {} piece {} of answer {}, expected piece {} of {}", ch.peer(),
                                  taken ? "took" : "sent", piece->index, piece->id, k, id));
  }
  return ok_status();
}

Status send_piece(Channel& ch, Kind kind, std::uint32_t id, std::uint64_t k, milliseconds timeout) {
  return ch.send(msg::encode_piece(kind, {id, static_cast<std::uint32_t>(k)}), timeout);
}

// One answer whose bytes may still be on their way as a segment: the reply (which keeps
// them alive), a copy when they could not be registered, and their registration.
// Destroyed bottom-up: the registration before the bytes.
struct Outgoing {
  RankGroup::FetchReply reply;
  std::vector<std::byte> copy;
  std::unique_ptr<transport::Region> region;
};

// Members are destroyed bottom-up: the channel (which cancels a segment in flight) first.
struct ServeConn {
  std::optional<Outgoing> sending;  // the last answer (the fetcher asks one at a time)
  // shm: the window answers are passed through (kAnswerSlots x kAnswerSlotBytes), made at
  // the first answer and kept for the channel's life.
  std::unique_ptr<transport::Ring> window;
  std::unique_ptr<Channel> ch;
  int from = -1;  // the fetcher's rank, once it said hello
};

struct FetchConn {
  std::unique_ptr<Channel> ch;
  std::uint32_t next_id = 0;
};

class Group final : public GroupBase {
 public:
  explicit Group(GroupOptions o)
      : GroupBase(o.rank, o.size, o.node),
        opts_(std::move(o)),
        refused_(std::make_shared<std::vector<std::string>>()),
        calls_(transport::TransportConfig{
            .secret = opts_.secret,
            .serialized = true,
            .on_refused = [r = refused_](const Status& why) { note_refusal(*r, why.message()); }}),
        serve_(transport::TransportConfig{.secret = opts_.secret}) {}

  ~Group() override {
    stop_.store(true);
    if (server_.joinable()) server_.join();
    MutexLock lock(call_mu_);
    // No fetch is in flight (they hold call_mu_): nothing to flush.
    for (auto& [peer, conn] : fetch_conns_) conn.ch->abort();
    close_members();
  }

  Status start() {
    // Nothing else runs yet: held so that the joining is checked like every later call.
    MutexLock lock(call_mu_);
    FERRY_RETURN_IF_ERROR(check_membership());
    const std::string me = "rank " + std::to_string(rank());
    if (auto t = calls_.for_address(opts_.root_address); !t.ok()) {
      if (t.status().code() != Code::kUnauthenticated) {
        return t.status().with_context(me + " joining the group at " + opts_.root_address);
      }
      return t.status().with_context(me +
                                     " has no session token for the checkpoint group (set "
                                     "NetGroupOptions::token, FERRY_TOKEN or FERRY_TOKEN_FILE)");
    }
    auto listener = serve_.listen(opts_.serve_address);
    if (!listener.ok()) return listener.status().with_context(me + " serving fetches");
    listener_ = std::move(*listener);
    serve_transport_ = *serve_.for_address(opts_.serve_address);  // made by listen()
    const std::string serving = listener_->address();
    nodes_.assign(size(), "");  // the serving thread reads none of these
    addresses_.assign(size(), "");
    nodes_[rank()] = node();
    server_ = std::thread([this] { serve_loop(); });

    const Deadline dl(opts_.timeout);
    Status s = rank() == 0 ? gather_members(serving, dl) : join(serving, dl);
    if (s.ok()) {
      log::debug("checkpoint group: rank {} of {} joined at {}", rank(), size(),
                 opts_.root_address);
    }
    return s;
  }

  Result<std::vector<std::string>> all_gather(std::string_view mine) override {
    MutexLock lock(call_mu_);
    if (!broken_.ok()) return broken_;
    const std::uint64_t seq = ++seq_;
    auto r = rank() == 0 ? gather_at_root(mine, seq) : gather_at_member(mine, seq);
    if (!r.ok()) {
      broken_ = r.status();
      if (rank() == 0) tell_members(broken_);
      close_members();  // the others see this rank gone at once, not at their timeout
    }
    return r;
  }

 private:
  // Closed, not aborted: an ABORT or the last collective's result may be on its way.
  void close_members() FERRY_REQUIRES(call_mu_) {
    if (root_) root_->close();
    for (auto& p : peers_) {
      if (p) p->close();
    }
  }

  // `s`, naming rank `r` if it does not yet: a channel the listener accepted names the
  // peer by where it came from (net), one this rank connected by the role it gave.
  Status named(int r, const Status& s) const {
    const std::string who = peer_name(r);
    return s.message().find(who) != std::string::npos ? s : s.with_context(who);
  }

  // ---- joining ----

  // Rank 0: accepts every other rank on the root address, then sends each the member
  // table. Connections wait side by side to say JOIN, each read as it arrives, so a silent
  // or half-sent one delays nobody; one that closes or says something else is dropped and
  // listed if the join times out.
  Status gather_members(const std::string& serving, const Deadline& dl) FERRY_REQUIRES(call_mu_) {
    // Serving on every interface: at the host the others reach rank 0 by.
    FERRY_ASSIGN_OR_RETURN(transport::Transport * t, calls_.for_address(opts_.root_address));
    auto reachable = t->reachable_address(serving, opts_.root_address);
    addresses_[0] = reachable.ok() ? *reachable : serving;
    if (size() == 1) return ok_status();
    auto listener = calls_.listen(opts_.root_address);
    if (!listener.ok()) return listener.status().with_context("rank 0 listening for the group");
    const auto poller = (*listener)->poller();
    peers_.resize(size());
    std::list<std::unique_ptr<Channel>> pending;
    const auto drop = [&](const std::string& why) {
      log::warn("checkpoint group: rank 0 dropped a connection to {}: {}", opts_.root_address, why);
      note_refusal(*refused_, why);
    };
    for (int joined = 1; joined < size();) {
      if (dl.passed()) return join_timeout();
      poller->progress();
      for (auto ch = (*listener)->accept(milliseconds(0)); ch.ok();
           ch = (*listener)->accept(milliseconds(0))) {
        if (pending.size() >= kMaxPendingHellos) {  // a flood must not run rank 0 out of fds
          drop((*ch)->peer() + ": too many connections have not said JOIN yet");
          continue;
        }
        pending.push_back(std::move(*ch));
      }
      std::vector<const Channel*> waiting;
      for (auto it = pending.begin(); it != pending.end();) {
        auto m = (*it)->try_receive(kHelloWait);
        if (m.ok() && !m->has_value()) {
          waiting.push_back(it->get());
          ++it;
          continue;
        }
        std::unique_ptr<Channel> ch = std::move(*it);
        it = pending.erase(it);
        if (!m.ok()) {
          drop(m.status().message());
          continue;
        }
        auto join = msg::decode_join(**m);
        if (!join.ok()) {
          drop(join.status().with_context(ch->peer()).message());
          continue;
        }
        FERRY_RETURN_IF_ERROR(admit(*join, std::move(ch)));
        ++joined;
      }
      idle(*poller, waiting, (*listener)->fd(), dl.left());
    }
    for (const auto& ch : pending) {
      log::warn(
          "checkpoint group: rank 0 dropped {}: it said nothing before the group was complete",
          ch->peer());
    }
    const std::vector<std::byte> table = msg::encode_table({nodes_, addresses_});
    for (int r = 1; r < size(); ++r) {
      if (Status s = peers_[r]->send(table, dl.left()); !s.ok()) {
        Status failed = named(r, s);
        tell_members(failed);
        return failed;
      }
    }
    return ok_status();
  }

  // Rank 0: takes rank `join.rank` on `ch`, or fails the join on every rank joined so far.
  Status admit(msg::Join& join, std::unique_ptr<Channel> ch) FERRY_REQUIRES(call_mu_) {
    const std::uint32_t r = join.rank;
    const std::string who = "rank " + std::to_string(r) + " (" + ch->peer() + ")";
    std::string address = std::move(join.address);
    Status bad =
        check_join(join, who, opts_.root_address, r < peers_.size() && peers_[r] != nullptr);
    if (bad.ok()) {
      // Serving on every interface: at the host its connection came from.
      auto t = calls_.for_address(opts_.root_address);
      auto reachable = t.ok() ? (*t)->reachable_address(address, ch->peer_address()) : t.status();
      if (reachable.ok()) {
        address = std::move(*reachable);
      } else {
        bad = failed_precondition("rank 0 cannot tell the address of " + who + " (" +
                                  reachable.status().message() +
                                  "); give it a serve_address with a host");
      }
    }
    if (!bad.ok()) {
      (void)ch->send(msg::encode_abort(bad), kAbortSendTimeout);
      tell_members(bad);
      return bad;
    }
    nodes_[r] = std::move(join.node);
    addresses_[r] = std::move(address);
    ch->set_peer(peer_name(r));
    peers_[r] = std::move(ch);
    return ok_status();
  }

  Status join_timeout() const FERRY_REQUIRES(call_mu_) {
    std::string missing;
    for (int r = 1; r < size(); ++r) {
      if (!peers_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    std::string msg = "rank 0 waited " + std::to_string(opts_.timeout.count()) + " ms on " +
                      opts_.root_address + " but rank(s) " + missing + " did not join";
    if (refused_->empty()) return timeout_error(msg);
    msg += "; refused: ";
    for (std::size_t i = 0; i < refused_->size(); ++i) msg += (i ? "; " : "") + (*refused_)[i];
    return unauthenticated(msg);
  }

  // Ranks > 0: connects to rank 0, says who it is, and gets the member table.
  Status join(const std::string& serving, const Deadline& dl) FERRY_REQUIRES(call_mu_) {
    const std::string what =
        "rank " + std::to_string(rank()) + " joining the group at " + opts_.root_address;
    auto ch = calls_.connect(opts_.root_address, dl.left(), "rank 0 (the group's root)");
    if (!ch.ok()) return ch.status().with_context(what);
    root_ = std::move(*ch);
    const std::vector<std::byte> hello =
        msg::encode_join({kVersion, static_cast<std::uint32_t>(rank()),
                          static_cast<std::uint32_t>(size()), node(), serving});
    if (Status s = root_->send(hello, dl.left()); !s.ok()) return s.with_context(what);
    auto table = root_->receive(dl.left());
    if (!table.ok()) return table.status().with_context(what);
    if (msg::kind_of(*table) == static_cast<std::uint8_t>(Kind::kAbort)) {
      return read_abort(*table).with_context(what);
    }
    auto members = msg::decode_table(*table, static_cast<std::uint32_t>(size()));
    if (!members.ok()) return members.status().with_context(what + ": rank 0");
    nodes_ = std::move(members->nodes);
    addresses_ = std::move(members->addresses);
    root_->set_peer(peer_name(0));
    return ok_status();
  }

  // ---- collectives ----

  Result<std::vector<std::string>> gather_at_root(std::string_view mine, std::uint64_t seq)
      FERRY_REQUIRES(call_mu_) {
    const Deadline dl(opts_.collective_timeout);
    std::vector<std::string> all(size());
    all[0] = std::string(mine);
    std::vector<msg::Blob> parts(size());
    int missing = size() - 1;
    const auto poller = size() > 1 ? peers_[1]->poller() : transport::plain_poller();
    while (missing > 0) {
      poller->progress();
      std::vector<const Channel*> waiting;
      for (int r = 1; r < size(); ++r) {
        while (!parts[r].complete()) {
          // A rank that began a message sends the rest at once.
          auto m = peers_[r]->try_receive(dl.left());
          if (!m.ok()) return named(r, m.status());
          if (!m->has_value()) {
            waiting.push_back(peers_[r].get());
            break;
          }
          FERRY_RETURN_IF_ERROR(parts[r].feed(**m, Kind::kPart, seq, peer_name(r)));
          if (parts[r].complete()) {
            all[r] = std::move(parts[r].data);
            --missing;
          }
        }
      }
      if (missing == 0) break;
      if (dl.passed()) {
        std::string late;
        for (int r = 1; r < size(); ++r) {
          if (!parts[r].complete()) late += (late.empty() ? "" : ", ") + peer_name(r);
        }
        return timeout_error(late + " did not reach collective #" + std::to_string(seq) +
                             " within " + std::to_string(opts_.collective_timeout.count()) + " ms");
      }
      idle(*poller, waiting, -1, dl.left());
    }
    const std::string result = msg::encode_parts(all);
    for (int r = 1; r < size(); ++r) {
      if (Status s = send_blob(*peers_[r], Kind::kResult, seq, result, dl); !s.ok()) {
        return named(r, s);
      }
    }
    return all;
  }

  Result<std::vector<std::string>> gather_at_member(std::string_view mine, std::uint64_t seq)
      FERRY_REQUIRES(call_mu_) {
    // Longer than rank 0's wait, so that when another rank is late, rank 0's error naming
    // it arrives here before this rank's own timeout.
    const auto grace = std::min<milliseconds>(opts_.collective_timeout, kMemberGrace);
    const Deadline dl(opts_.collective_timeout + grace);
    FERRY_RETURN_IF_ERROR(send_blob(*root_, Kind::kPart, seq, mine, dl));
    msg::Blob result;
    while (!result.complete()) {
      auto m = root_->receive(dl.left());
      if (!m.ok()) return m.status();
      if (msg::kind_of(*m) == static_cast<std::uint8_t>(Kind::kAbort)) return read_abort(*m);
      FERRY_RETURN_IF_ERROR(result.feed(*m, Kind::kResult, seq, peer_name(0)));
    }
    auto all = msg::decode_parts(result.data, static_cast<std::uint32_t>(size()));
    if (!all.ok()) return all.status().with_context(peer_name(0));
    return all;
  }

  // Rank 0: tells every member that the group failed and why, so that none of them waits
  // for its own timeout. A member reads it in its current or next collective.
  void tell_members(const Status& why) FERRY_REQUIRES(call_mu_) {
    for (auto& p : peers_) {
      if (p && p->valid()) (void)p->send(msg::encode_abort(why), kAbortSendTimeout);
    }
  }

  // ---- fetches (caller side) ----

  Status fetch_impl(int peer, std::string_view request, std::span<std::byte>* into,
                    std::string* text) override {
    if (peer < 0 || peer >= size()) return invalid_argument("fetch from a rank outside the group");
    MutexLock lock(call_mu_);
    const Deadline dl(opts_.timeout);
    FetchConn& conn = fetch_conns_[peer];
    if (!conn.ch) {
      auto ch = calls_.connect(addresses_[peer], dl.left(), peer_name(peer));
      if (!ch.ok()) return ch.status();
      (*ch)->set_peer(peer_name(peer));
      const std::vector<std::byte> hello =
          msg::encode_fetch_hello({kVersion, static_cast<std::uint32_t>(rank())});
      FERRY_RETURN_IF_ERROR((*ch)->send(hello, dl.left()));
      conn.ch = std::move(*ch);
    }
    bool out_of_step = false;
    Status s = exchange(conn, peer, request, into, text, dl, &out_of_step);
    if (out_of_step) {
      conn.ch->abort();  // the channel may hold half an answer: start afresh next time
      fetch_conns_.erase(peer);
    }
    return s;
  }

  // One request and its answer on `conn`. *out_of_step: the channel failed or may hold
  // the rest of an answer, so it must not be used again.
  Status exchange(FetchConn& conn, int peer, std::string_view request, std::span<std::byte>* into,
                  std::string* text, const Deadline& dl, bool* out_of_step)
      FERRY_REQUIRES(call_mu_) {
    const std::uint32_t id = ++conn.next_id;
    const std::uint64_t expected = into != nullptr ? into->size() : kAnySize;
    const std::vector<std::byte> m = msg::encode_fetch({id, expected, std::string(request)});
    if (m.size() > transport::kMaxMessageBytes) {
      return invalid_argument("a fetch request of " + std::to_string(request.size()) +
                              " bytes is over the limit of " +
                              std::to_string(transport::kMaxMessageBytes));
    }
    *out_of_step = true;
    Channel& ch = *conn.ch;
    FERRY_RETURN_IF_ERROR(ch.send(m, dl.left()));
    ScopedFd memory;  // shm: the answer's bytes, passed with it
    auto reply = ch.receive_with_fd(dl.left(), &memory);
    if (!reply.ok()) return reply.status();
    auto answer = check_answer(*reply, id, peer, expected);
    if (!answer.ok()) return answer.status();
    if (answer->code != Code::kOk) {
      *out_of_step = false;  // no bytes follow an error
      return Status(answer->code, answer->error);
    }
    std::span<std::byte> dst;
    if (into != nullptr) {
      dst = *into;
    } else {
      text->resize(answer->size);
      dst = std::as_writable_bytes(std::span(*text));
    }
    if (!dst.empty()) FERRY_RETURN_IF_ERROR(receive_answer(ch, peer, id, dst, memory, dl));
    *out_of_step = false;
    return ok_status();
  }

  // The answer's bytes into `dst`: the channel's next segment, straight into it, where the
  // channel sends segments' bytes (net); else piece by piece out of the window `memory` that
  // came with the answer (shm): each PIECE is read from its slot, and answered with TAKEN
  // where the server needs the slot again.
  Status receive_answer(Channel& ch, int peer, std::uint32_t id, std::span<std::byte> dst,
                        const ScopedFd& memory, const Deadline& dl) FERRY_REQUIRES(call_mu_) {
    if (!ch.shares_memory()) {
      auto region = ch.register_memory(dst);
      if (!region.ok()) return region.status().with_context("fetching from " + peer_name(peer));
      return ch.receive_segment(dst, region->get(), dl.left());
    }
    if (!memory.valid()) return corruption(peer_name(peer) + " passed no memory with its answer");
    FERRY_ASSIGN_OR_RETURN(transport::Transport * t, calls_.for_address(addresses_[peer]));
    const std::uint64_t pieces = piece_count(dst.size());
    for (std::uint64_t k = 0; k < pieces; ++k) {
      FERRY_RETURN_IF_ERROR(receive_piece(ch, Kind::kPiece, id, k, dl, stop_));
      FERRY_RETURN_IF_ERROR(t->read_peer_memory(memory, (k % kAnswerSlots) * kAnswerSlotBytes,
                                                piece_of(dst, k), peer_name(peer)));
      if (k + kAnswerSlots < pieces) {
        FERRY_RETURN_IF_ERROR(send_piece(ch, Kind::kTaken, id, k, dl.left()));
      }
    }
    return ok_status();
  }

  // ---- fetches (serving side, on server_) ----

  void serve_loop() {
    std::list<ServeConn> conns;
    ServingThreads alone(kMaxServingThreads);  // channels served on threads of their own
    const auto poller = listener_->poller();
    while (!stop_.load()) {
      poller->progress();
      for (auto ch = listener_->accept(milliseconds(0)); ch.ok();
           ch = listener_->accept(milliseconds(0))) {
        ServeConn c{std::nullopt, nullptr, std::move(*ch), -1};
        // A channel that shares memory answers through its window (send_in_pieces), so it
        // gets a thread of its own: it waits for its fetcher's TAKEN between an answer's
        // pieces, and fetchers do not queue behind each other's copies.
        if (c.ch->shares_memory()) {
          if (!alone.start([this, c = std::move(c)]() mutable { serve_alone(c); })) {
            // The channel went with the work: the fetcher sees it closed.
            log::warn("checkpoint group: rank {} drops a fetch channel: {} are served already",
                      rank(), kMaxServingThreads);
          }
        } else {
          conns.push_back(std::move(c));
        }
      }
      std::vector<const Channel*> waiting;
      for (auto it = conns.begin(); it != conns.end();) {
        if (!serve_arrived(*it)) {
          it = conns.erase(it);
          continue;
        }
        waiting.push_back(it->ch.get());
        ++it;
      }
      idle(*poller, waiting, listener_->fd(), kIdleWait);
    }
    for (ServeConn& c : conns) c.ch->abort();
    conns.clear();
    alone.join_all();
    listener_.reset();
  }

  // serve_loop's work for one channel whose poll_fd is its socket, until the fetcher leaves
  // or the group closes.
  void serve_alone(ServeConn& c) {
    while (serve_arrived(c)) {
      if (stop_.load()) {
        c.ch->abort();
        return;
      }
      pollfd fd{c.ch->poll_fd(), POLLIN, 0};
      (void)::poll(&fd, 1, static_cast<int>(kIdleWait.count()));
    }
  }

  // Answers what arrived on `c`; false when the channel failed and was dropped (logged,
  // unless the fetcher just left).
  bool serve_arrived(ServeConn& c) {
    Status s = serve_ready(c);
    if (s.ok()) return true;
    if (s.code() != Code::kAborted) {
      log::warn("checkpoint group: rank {} drops a fetch channel: {}", rank(), s.to_string());
    }
    c.ch->abort();  // first: it cancels a segment still being sent
    return false;
  }

  // Answers the requests that arrived on `c`; an error drops the channel.
  Status serve_ready(ServeConn& c) {
    while (true) {
      auto m = c.ch->try_receive(opts_.timeout);
      if (!m.ok()) return m.status();
      if (!m->has_value()) return ok_status();
      FERRY_RETURN_IF_ERROR(serve_one(c, **m));
    }
  }

  Status serve_one(ServeConn& c, std::span<const std::byte> m) {
    if (msg::kind_of(m) == static_cast<std::uint8_t>(Kind::kFetchHello)) {
      auto from = check_fetch_hello(m, c.ch->peer());
      if (!from.ok()) return from.status();
      c.from = *from;
      return ok_status();
    }
    auto fetch = msg::decode_fetch(m);
    if (!fetch.ok()) return fetch.status().with_context(c.ch->peer());
    if (c.from < 0) {
      return corruption("a fetch request before the fetch hello from " + c.ch->peer());
    }
    // The fetcher asks again only once it has the last answer, so its segment is sent.
    FERRY_RETURN_IF_ERROR(c.ch->await_segments(opts_.timeout));
    c.sending.reset();
    Outgoing& out = c.sending.emplace();
    const std::vector<std::byte> head = answer_fetch(c.from, *fetch, &out.reply);
    std::span<const std::byte> bytes = out.reply.bytes();
    if (!bytes.empty() && c.ch->shares_memory()) return send_in_pieces(c, fetch->id, head, bytes);
    FERRY_RETURN_IF_ERROR(c.ch->send(head, opts_.timeout));
    if (bytes.empty()) return ok_status();
    // Straight from the handler's memory (a mapped shard) when it can be registered; a
    // segment's bytes are only read. Otherwise from a copy.
    auto region = c.ch->register_memory({const_cast<std::byte*>(bytes.data()), bytes.size()});
    if (!region.ok()) {
      out.copy.assign(bytes.begin(), bytes.end());
      bytes = out.copy;
      region = c.ch->register_memory(out.copy);
      if (!region.ok()) return region.status();
    }
    out.region = std::move(*region);
    return c.ch->publish_segment(bytes, out.region.get());
  }

  // shm: the answer's bytes through the channel's window, a sealed memfd passed with the
  // ANSWER (the shm channel carries a message in 32 KiB datagrams, several times slower):
  // piece k is copied into slot k % kAnswerSlots once the fetcher took piece k -
  // kAnswerSlots, then PIECE says it is there.
  Status send_in_pieces(ServeConn& c, std::uint32_t id, std::span<const std::byte> head,
                        std::span<const std::byte> bytes) {
    if (!c.window) {
      FERRY_ASSIGN_OR_RETURN(c.window,
                             serve_transport_->allocate_ring(kAnswerSlots, kAnswerSlotBytes));
    }
    FERRY_RETURN_IF_ERROR(c.ch->send_with_fd(head, opts_.timeout, c.window->share_fd()));
    const std::uint64_t pieces = piece_count(bytes.size());
    for (std::uint64_t k = 0; k < pieces; ++k) {
      if (k >= kAnswerSlots) {
        FERRY_RETURN_IF_ERROR(receive_piece(*c.ch, Kind::kTaken, id, k - kAnswerSlots,
                                            Deadline(opts_.timeout), stop_));
      }
      const auto part = piece_of(bytes, k);
      std::copy(part.begin(), part.end(), c.window->slot(k % kAnswerSlots));
      FERRY_RETURN_IF_ERROR(send_piece(*c.ch, Kind::kPiece, id, k, opts_.timeout));
    }
    return ok_status();
  }

  const GroupOptions opts_;
  std::vector<std::string> addresses_;  // where each rank serves fetches

  Mutex call_mu_;  // the calling side: calls_ and everything made from it
  // Refusals on the root address, for the join's timeout error (calls_'s listener adds).
  const std::shared_ptr<std::vector<std::string>> refused_;
  transport::Registry calls_ FERRY_GUARDED_BY(call_mu_);
  std::unique_ptr<Channel> root_ FERRY_GUARDED_BY(call_mu_);                // ranks > 0
  std::vector<std::unique_ptr<Channel>> peers_ FERRY_GUARDED_BY(call_mu_);  // rank 0
  std::map<int, FetchConn> fetch_conns_ FERRY_GUARDED_BY(call_mu_);
  std::uint64_t seq_ FERRY_GUARDED_BY(call_mu_) = 0;
  Status broken_ FERRY_GUARDED_BY(call_mu_);

  transport::Registry serve_;  // the serving side: server_ alone uses it, once started
  transport::Transport* serve_transport_ = nullptr;  // serve_'s, for the answers' memory
  std::unique_ptr<transport::Listener> listener_;
  std::thread server_;
  std::atomic<bool> stop_{false};
};

Result<std::unique_ptr<checkpoint::RankGroup>> connect_group(GroupOptions o,
                                                             const std::string& scheme,
                                                             const char* form) {
  if (transport::Registry::scheme_of(o.root_address) != scheme) {
    return invalid_argument("the group's root address '" + o.root_address + "' is not " + form);
  }
  auto g = std::make_unique<Group>(std::move(o));
  FERRY_RETURN_IF_ERROR(g->start());
  return std::unique_ptr<checkpoint::RankGroup>(std::move(g));
}

}  // namespace
}  // namespace ferry::rank_group

namespace ferry::checkpoint {

Result<std::unique_ptr<RankGroup>> connect_local_group(const LocalGroupOptions& o) {
  // This rank's fetch address: abstract, so nothing is left on disk.
  const std::string serve =
      fmt::format("@ferry-ckpt-{:016x}-r{}", random_u64(), static_cast<unsigned>(o.rank));
  return rank_group::connect_group(
      {o.root_address, o.rank, o.size, o.node, serve, "", o.timeout, o.collective_timeout}, "shm",
      "\"@name\", a name or a path");
}

Result<std::unique_ptr<RankGroup>> connect_net_group(const NetGroupOptions& o) {
  return rank_group::connect_group({o.root_address, o.rank, o.size, o.node, o.serve_address,
                                    o.token, o.timeout, o.collective_timeout},
                                   "net", "\"host:port\"");
}

}  // namespace ferry::checkpoint

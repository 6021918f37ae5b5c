#include "sync/fanout_set.h"

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <chrono>

#include "base/clock.h"
#include "base/status_macros.h"
#include "wire/message.h"

namespace ferry::sync {

using std::chrono::milliseconds;

namespace {

bool acked(const Peer& p) { return p.acked; }

}  // namespace

FanoutSet::FanoutSet(const SyncOptions& options, std::unique_ptr<transport::Poller> poller)
    : options_(options), interrupted_(options), poller_(std::move(poller)) {}

Result<Fanout*> FanoutSet::add(const std::string& address, const SyncOptions& options,
                               transport::Ring* ring, transport::Registry& transports,
                               std::string noun) {
  FERRY_ASSIGN_OR_RETURN(auto f, Fanout::create_over(address, options, ring, transports));
  f->set_peer_noun(std::move(noun));
  members_.push_back(std::move(f));
  return members_.back().get();
}

void FanoutSet::set_session(std::uint64_t session, std::uint64_t round) {
  for (auto& f : members_) {
    f->set_session(session);
    f->set_round(round);
  }
}

bool FanoutSet::no_peers() const {
  return std::all_of(members_.begin(), members_.end(),
                     [](const auto& f) { return f->peers().empty(); });
}

Status FanoutSet::forward_round(RoundReader& from) {
  for (auto& f : members_) {
    f->set_round(from.last_round());
    for (Peer& p : f->peers()) {
      p.released = 0;
      p.acked = false;
    }
  }
  FERRY_RETURN_IF_ERROR(send_all(from));
  // A copy: message() is the next message once next() is called.
  const std::uint32_t buckets = std::get<wire::Begin>(from.message().body).bucket_count;
  std::uint32_t released_upstream = 0;
  bool ended = false;
  while (!ended || !all_acked()) {
    FERRY_ASSIGN_OR_RETURN(bool from_upstream,
                           wait(from, ended ? "acknowledgements" : "the sender or releases"));
    if (from_upstream) {
      FERRY_ASSIGN_OR_RETURN(auto segment, from.next());  // verified, or an error
      ended = !segment;
      FERRY_RETURN_IF_ERROR(send_all(from));
    }
    for (; released_upstream < released(buckets); ++released_upstream) {
      FERRY_RETURN_IF_ERROR(from.release(released_upstream));
    }
  }
  for (auto& f : members_) FERRY_RETURN_IF_ERROR(f->drain_transfers());
  return from.acknowledge();
}

// The message as it came: the round checksum every end computes is the same.
Status FanoutSet::send_all(const RoundReader& from) {
  for (auto& f : members_) {
    FERRY_RETURN_IF_ERROR(f->send_all_bytes(from.message_bytes(), from.message()));
  }
  return ok_status();
}

std::uint32_t FanoutSet::released(std::uint32_t buckets) const {
  for (const auto& f : members_) {
    for (const Peer& p : f->peers()) buckets = std::min(buckets, p.released);
  }
  return buckets;
}

bool FanoutSet::all_acked() const {
  return std::all_of(members_.begin(), members_.end(), [](const auto& f) {
    return std::all_of(f->peers().begin(), f->peers().end(), acked);
  });
}

Result<bool> FanoutSet::wait(RoundReader& from, std::string_view waiting_for) {
  const auto deadline = Clock::now() + options_.timeout;
  std::vector<pollfd> fds;
  while (true) {
    poller_->progress();
    FERRY_ASSIGN_OR_RETURN(bool waiting, from.message_waiting());
    if (waiting) return true;
    for (auto& f : members_) {
      FERRY_ASSIGN_OR_RETURN(bool heard, f->handle_arrived(acked, from.round_checksum()));
      if (heard) return false;
    }
    fds.clear();
    fds.push_back({from.poll_fd(), POLLIN, 0});
    for (auto& f : members_) f->add_poll_fds(acked, &fds);
    const auto left = std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()),
                               milliseconds(0));
    FERRY_ASSIGN_OR_RETURN(int ready, poller_->wait(fds, wait_slice(options_, left)));
    if (ready == 0) FERRY_RETURN_IF_ERROR(interrupted_());
    if (ready > 0) continue;  // read at the loop's head, before the deadline is looked at
    // Only news restarts the silence timer: UCX also wakes the poller for its own traffic
    // (retries, keepalives to an unreachable peer), which is no sign of life.
    if (Clock::now() >= deadline) {
      std::string slow;
      for (const auto& f : members_) {
        for (const Peer& p : f->peers()) {
          if (!p.acked) slow += (slow.empty() ? "" : ", ") + p.link.peer();
        }
      }
      return timeout_error(
          fmt::format("round {}: nothing from {} or downstream ({}) for {} ms while waiting for {}",
                      from.last_round(), from.peer(), slow, options_.timeout.count(), waiting_for));
    }
  }
}

void FanoutSet::fail(const Status& why) {
  for (auto& f : members_) (void)f->fail(why);
}

}  // namespace ferry::sync

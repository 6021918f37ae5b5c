// Relay: upstream it is one receiver of a net session (a RoundReader that verifies each
// segment but delivers none); downstream it is the sender of the same session to this node's
// local receivers (Fanout over shm) and, in a chain or tree, to relays on other nodes (a
// second Fanout, over net), both serving the reader's ring. Messages pass through unchanged,
// so the round checksum every end computes is the same everywhere.
#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <chrono>

#include "base/clock.h"
#include "base/status_macros.h"
#include "ferry/sync.h"
#include "profiler/span.h"
#include "sync/fanout.h"
#include "sync/join.h"
#include "sync/round_reader.h"
#include "transport/net/context.h"
#include "transport/transport.h"
#include "wire/message.h"

namespace ferry::sync {

using std::chrono::milliseconds;

struct Relay::Impl {
  SyncOptions options;
  std::uint32_t id = 0;
  // Reads upstream's rounds into this node's ring, verified, and owns the ring: after the
  // fanouts that serve it, so it outlives them.
  std::unique_ptr<RoundReader> upstream;
  std::unique_ptr<transport::Poller> poller;  // upstream's wait loop, beside local peers' fds
  std::unique_ptr<Fanout> local;
  std::unique_ptr<Fanout> relays;  // downstream relays (nullptr: none served)

  // Every downstream peer, local receivers and relays alike.
  template <typename F>
  void for_each_peer(F f) {
    for (Peer& p : local->peers()) f(p);
    if (relays) {
      for (Peer& p : relays->peers()) f(p);
    }
  }
  void set_round(std::uint64_t round) {
    local->set_round(round);
    if (relays) relays->set_round(round);
    for_each_peer([](Peer& p) {
      p.released = 0;
      p.acked = false;
    });
  }
  // Upstream's message, as it came: the round checksum every end computes is the same.
  Status forward() {
    // Relays first: their copy crosses a network, the local ones only memory.
    const auto& bytes = upstream->message_bytes();
    if (relays) FERRY_RETURN_IF_ERROR(relays->send_all_bytes(bytes, upstream->message()));
    return local->send_all_bytes(bytes, upstream->message());
  }

  // Downstream hears first (it costs at most 100 ms a peer); then upstream gets the report
  // and the time to read it (the reader lingers) before this relay closes the link.
  // An error the reader met is already named and was already told upstream.
  Status fail(Status why) {
    const Status& broken = upstream->status();
    const Status named =
        broken.ok() ? Status(why.code(), fmt::format("relay {}: {}", id, why.message())) : broken;
    if (relays) (void)relays->fail(named);
    if (local) (void)local->fail(named);
    return upstream->abort(std::move(why));
  }

  // Waits for news from the peers below, up to `left`: true if any came.
  Result<bool> hear_downstream(std::vector<pollfd>& fds, milliseconds left) {
    // Downstream relays share the upstream's engine: their news arrived with its progress.
    if (relays) {
      FERRY_ASSIGN_OR_RETURN(bool heard,
                             relays->handle_waiting([](const Peer& p) { return p.acked; },
                                                    upstream->round_checksum()));
      if (heard) return true;
    }
    fds.clear();
    local->add_poll_fds([](const Peer& p) { return p.acked; }, &fds);
    FERRY_RETURN_IF_ERROR(poller->wait(fds, left).status());
    return local->handle_ready(fds, 0, upstream->round_checksum());
  }

  Result<RoundStats> relay_round() {
    profiler::Span round_span("sync.relay_round");
    FERRY_ASSIGN_OR_RETURN(RoundBegin begin, upstream->begin(ReadInto::kPassThrough));
    set_round(begin.round);
    FERRY_RETURN_IF_ERROR(forward());
    // A copy: message() is the next message once next() is called.
    const std::uint32_t buckets = std::get<wire::Begin>(upstream->message().body).bucket_count;
    std::uint32_t released_upstream = 0;
    bool ended = false;
    std::vector<pollfd> fds;
    auto deadline = Clock::now() + options.timeout;
    while (true) {
      // A bucket goes back upstream once every peer below released it: a relay's RELEASE
      // says its whole subtree has the bucket.
      std::uint32_t all_released = buckets;
      bool all_acked = true;
      for_each_peer([&](const Peer& p) {
        all_released = std::min(all_released, p.released);
        all_acked &= p.acked;
      });
      for (; released_upstream < all_released; ++released_upstream) {
        FERRY_RETURN_IF_ERROR(upstream->release(released_upstream));
      }
      if (ended && all_acked) {
        if (relays) FERRY_RETURN_IF_ERROR(relays->drain_transfers());
        FERRY_RETURN_IF_ERROR(upstream->acknowledge());
        return upstream->stats();
      }
      // Upstream first: a segment waiting there is what the peers below wait for.
      poller->progress();
      FERRY_ASSIGN_OR_RETURN(bool waiting, upstream->message_waiting());
      if (waiting) {
        FERRY_ASSIGN_OR_RETURN(auto segment, upstream->next());
        ended = !segment;
        FERRY_RETURN_IF_ERROR(forward());
        deadline = Clock::now() + options.timeout;
        continue;
      }
      const auto left = std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()),
                                 milliseconds(0));
      FERRY_ASSIGN_OR_RETURN(bool heard, hear_downstream(fds, left));
      // Only news from a peer restarts the silence timer: UCX also wakes the event fd for
      // its own traffic (retries, keepalives to an unreachable peer), which is no sign of life.
      if (heard) {
        deadline = Clock::now() + options.timeout;
      } else if (Clock::now() >= deadline) {
        std::string slow;
        for_each_peer([&](const Peer& p) {
          if (!p.acked) slow += (slow.empty() ? "" : ", ") + p.link.peer();
        });
        return timeout_error(fmt::format(
            "round {}: nothing from {} or downstream ({}) for {} ms while waiting for {}",
            begin.round, upstream->peer(), slow, options.timeout.count(),
            ended ? "acknowledgements" : "the sender or releases"));
      }
    }
  }
};

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Relay::~Relay() = default;

Result<std::unique_ptr<Relay>> Relay::connect(const std::string& upstream, std::uint32_t relay_id,
                                              const std::string& local_address,
                                              const SyncOptions& options,
                                              const std::string& relays_address) {
  if (options.timeout.count() <= 0) return invalid_argument("timeout must be positive");
  if (!transport::is_net_address(upstream)) {
    return invalid_argument(
        fmt::format("relay upstream '{}' is not a host:port address", upstream));
  }
  if (transport::is_net_address(local_address)) {
    return invalid_argument(
        fmt::format("relay local address '{}' must be a shm address "
                    "(\"@name\" or a path)",
                    local_address));
  }
  if (!relays_address.empty() && !transport::is_net_address(relays_address)) {
    return invalid_argument(fmt::format(
        "relay address for downstream relays '{}' is not a host:port address", relays_address));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->id = relay_id;
  // One UCX context for upstream and downstream relays, so one wait loop hears both.
  std::shared_ptr<net::Context> context;
  if (!relays_address.empty()) {
    FERRY_ASSIGN_OR_RETURN(context, net::Context::create());
  }
  FERRY_ASSIGN_OR_RETURN(impl->upstream,
                         join_session(upstream, JoinAs{"relay", relay_id, 0, context}, options));
  RoundReader& reader = *impl->upstream;
  reader.set_name(fmt::format("relay {}", relay_id));
  impl->poller = reader.poller();
  SyncOptions local_options = options;
  local_options.checksums = reader.checksums();  // the peers below check what the sender sums
  FERRY_ASSIGN_OR_RETURN(impl->local,
                         Fanout::create_over(local_address, local_options, &reader.ring(), {}));
  impl->local->set_peer_noun("local receiver");
  if (!relays_address.empty()) {
    FERRY_ASSIGN_OR_RETURN(
        impl->relays, Fanout::create_over(relays_address, local_options, &reader.ring(), context));
    impl->relays->set_peer_noun("relay");
  }
  for (Fanout* f : {impl->local.get(), impl->relays.get()}) {
    if (f == nullptr) continue;
    f->set_session(reader.session_id());
    f->set_round(reader.last_round());
  }
  return std::unique_ptr<Relay>(new Relay(std::move(impl)));
}

Status Relay::accept(std::uint32_t local_receivers, std::uint32_t downstream_relays) {
  FERRY_RETURN_IF_ERROR(impl_->upstream->status());
  if (downstream_relays > 0 && !impl_->relays) {
    return failed_precondition(
        fmt::format("relay {}: accept({} downstream relays) needs a relays address at connect()",
                    impl_->id, downstream_relays));
  }
  Status s = impl_->local->accept(local_receivers);
  if (s.ok() && downstream_relays > 0) s = impl_->relays->accept(downstream_relays);
  // Upstream hears why this relay will not serve the round, naming it.
  return s.ok() ? s : impl_->fail(s);
}

Result<RoundStats> Relay::relay_round() {
  if (impl_->local->peers().empty() && (!impl_->relays || impl_->relays->peers().empty())) {
    return failed_precondition("relay_round: no local receiver or downstream relay has joined");
  }
  auto r = impl_->relay_round();
  if (!r.ok()) return impl_->fail(r.status());
  return r;
}

std::uint64_t Relay::session_id() const { return impl_->upstream->session_id(); }
const std::string& Relay::local_address() const { return impl_->local->address(); }
const std::string& Relay::relays_address() const {
  static const std::string kNone;
  return impl_->relays ? impl_->relays->address() : kNone;
}

}  // namespace ferry::sync

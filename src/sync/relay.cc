// Relay: upstream it is one receiver of a net session; downstream it is the sender of
// the same session to this node's local receivers (Fanout over shm) and, in a chain or tree,
// to relays on other nodes (a second Fanout, over net, sending from the same ring). Messages
// pass through unchanged, so the round checksum every end computes is the same everywhere.
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "base/clock.h"
#include "base/status_macros.h"
#include "ferry/sync.h"
#include "profiler/span.h"
#include "sync/fanout.h"
#include "sync/link.h"
#include "sync/round_checksum.h"
#include "sync/sync_options.h"
#include "transport/net/context.h"
#include "transport/transport.h"
#include "wire/conversation.h"
#include "wire/message.h"

namespace ferry::sync {

using std::chrono::milliseconds;

// The longest a failed relay waits for the sender to read its ERROR (see fail()).
constexpr milliseconds kReportDeliveryBound{5000};

struct Relay::Impl {
  SyncOptions options;
  InterruptCheck interrupted;  // set with options in create()
  std::uint32_t id = 0;
  Link upstream;
  std::unique_ptr<transport::Poller> poller;  // upstream's wait loop, beside local peers' fds
  wire::Conversation conversation{wire::Conversation::Role::kReceiver, "", 0};
  std::unique_ptr<Fanout> local;
  // The local ring, registered for upstream's segments; after local, so it is deregistered
  // before the ring is unmapped.
  std::unique_ptr<transport::Region> ring_region;
  // Downstream relays (nullptr: none served); after local, whose ring it sends from.
  std::unique_ptr<Fanout> relays;
  Status broken;

  // Every downstream peer, local receivers and relays alike.
  template <typename F>
  void for_each_peer(F f) {
    for (Peer& p : local->peers()) f(p);
    if (relays) {
      for (Peer& p : relays->peers()) f(p);
    }
  }
  Status send_downstream(const std::vector<std::byte>& bytes, const wire::Message& m) {
    // Relays first: their copy crosses a network, the local ones only memory.
    if (relays) FERRY_RETURN_IF_ERROR(relays->send_all_bytes(bytes, m));
    return local->send_all_bytes(bytes, m);
  }

  wire::Message upstream_message(std::uint64_t round, wire::Body body) const {
    return session_message(conversation.session(), round, std::move(body));
  }

  // Downstream hears first (it costs at most 100 ms a peer); then upstream gets the report
  // and the time to read it before this relay closes the link.
  Status fail(Status why) {
    if (broken.ok()) broken = why;
    if (relays) (void)relays->fail(why);
    if (local) (void)local->fail(why);
    if (upstream.valid()) {
      const Status sent =
          upstream.send(wire::encode(upstream_message(conversation.round(),
                                                      wire::Error{why.code(), why.message()})),
                        milliseconds(100));
      if (sent.ok() || sent.code() == Code::kTimeout) await_upstream_hangup();
      upstream.close();  // flushes the ERROR, so the sender learns why, not only that we left
    }
    return why;
  }

  // The sender ends the session (an ERROR to every peer, then it hangs up) once it has read
  // a peer's ERROR. Until then this relay keeps its link open: a sender that found the link
  // closed before it got to the report (it was waiting on another node, or pulling weights)
  // would name only this relay, not the receiver or relay behind it that failed. Bounded by
  // kReportDeliveryBound (and the session's timeout), and by an interrupt (stop, Ctrl-C).
  void await_upstream_hangup() {
    const Deadline deadline(std::min(options.timeout, kReportDeliveryBound));
    while (!deadline.passed()) {
      auto got = upstream.receive(wait_slice(options, deadline.left()));
      if (got.ok()) {
        auto m = wire::decode(*got, upstream.peer());
        if (!m.ok() || m->type() == wire::MessageType::kError) return;  // the sender ended it
        continue;  // the round's traffic, no longer wanted
      }
      if (got.status().code() != Code::kTimeout) return;  // hung up
      if (!interrupted().ok()) return;
    }
  }

  Result<wire::Message> decode_upstream(const std::vector<std::byte>& bytes) {
    return decode_from_sender(bytes, upstream, conversation);
  }

  Status receive_segment(const wire::Filled& f) {
    std::span<std::byte> into(local->ring().slot(f.slot) + f.offset, f.used_bytes - f.offset);
    return upstream.channel().receive_segment(into, ring_region.get(), options.timeout);
  }

  Result<RoundStats> relay_round() {
    profiler::Span round_span("sync.relay_round");
    // Between rounds in slices, so stop() and Ctrl-C are heard while upstream is quiet.
    auto first_bytes =
        receive_heeding_interrupt(upstream, options.idle_timeout, options, interrupted);
    if (!first_bytes.ok()) return first_bytes.status();
    const auto start = Clock::now();
    auto begin = decode_upstream(*first_bytes);
    if (!begin.ok()) return begin.status();
    if (begin->type() != wire::MessageType::kBegin) {
      return internal_error("conversation let a non-BEGIN message start a round");
    }
    const std::uint64_t round = begin->round;
    const auto& b = std::get<wire::Begin>(begin->body);
    RoundStats stats;
    stats.round = round;
    stats.tensors = static_cast<std::uint32_t>(b.manifest.size());
    stats.buckets = b.bucket_count;
    stats.bytes = b.total_bytes;
    stats.step = b.step;
    local->set_round(round);
    if (relays) relays->set_round(round);
    for_each_peer([](Peer& p) {
      p.released = 0;
      p.acked = false;
    });
    Status s = send_downstream(*first_bytes, *begin);
    if (!s.ok()) return s;
    RoundChecksum round_sum(*first_bytes);
    std::uint32_t released_upstream = 0;
    bool ended = false;
    std::uint64_t digest = 0;
    std::vector<pollfd> fds;
    auto deadline = Clock::now() + options.timeout;
    while (true) {
      // Buckets every local receiver and downstream relay released go back upstream, in
      // order: a relay's RELEASE says its whole subtree has the bucket.
      std::uint32_t all_released = b.bucket_count;
      bool all_acked = true;
      for_each_peer([&](const Peer& p) {
        all_released = std::min(all_released, p.released);
        all_acked &= p.acked;
      });
      for (; released_upstream < all_released; ++released_upstream) {
        const std::uint32_t slot = released_upstream % local->ring().slots();
        s = upstream.send(
            wire::encode(upstream_message(round, wire::Release{slot, released_upstream})),
            options.timeout);
        if (!s.ok()) return s;
      }
      if (ended && all_acked) {
        if (relays) FERRY_RETURN_IF_ERROR(relays->drain_transfers());
        s = upstream.send(wire::encode(upstream_message(round, wire::Ack{b.bucket_count, digest})),
                          options.timeout);
        if (!s.ok()) return s;
        stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        stats.checksum = digest;
        return stats;
      }
      // Upstream first: a segment waiting there is what local receivers wait for.
      poller->progress();
      auto got = upstream.try_receive();
      if (!got.ok()) return got.status();
      if (got->has_value()) {
        auto m = decode_upstream(**got);
        if (!m.ok()) return m.status();
        if (m->type() == wire::MessageType::kEnd) {
          const auto& e = std::get<wire::End>(m->body);
          digest = round_sum.digest();
          if (e.round_checksum != digest) {
            return corruption(
                fmt::format("round {}: round checksum {:016x} from {}, the relay "
                            "computed {:016x}",
                            round, e.round_checksum, upstream.peer(), digest));
          }
          ended = true;
        } else {
          const auto& f = std::get<wire::Filled>(m->body);
          if (f.used_bytes > f.offset) {
            profiler::Span span("sync.net_receive", profiler::Detail::kBucket);
            s = receive_segment(f);
            if (!s.ok()) {
              return Status(s.code(),
                            fmt::format("round {} bucket {}: {}", round, f.bucket, s.message()));
            }
          }
          round_sum.add_bucket(f.bucket, f.used_bytes, f.checksum);
        }
        s = send_downstream(**got, *m);
        if (!s.ok()) return s;
        deadline = Clock::now() + options.timeout;
        continue;
      }
      // Downstream relays share the upstream's engine: their news arrived with its progress.
      if (relays) {
        auto heard = relays->handle_waiting([](const Peer& p) { return p.acked; }, digest);
        if (!heard.ok()) return heard.status();
        if (*heard) {
          deadline = Clock::now() + options.timeout;
          continue;
        }
      }
      // Then whatever local receivers say.
      fds.clear();
      local->add_poll_fds([](const Peer& p) { return p.acked; }, &fds);
      const auto left = std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()),
                                 milliseconds(0));
      auto ready = poller->wait(fds, left);
      if (!ready.ok()) return ready.status();
      auto handled = local->handle_ready(fds, 0, digest);
      if (!handled.ok()) return handled.status();
      // Only news from a peer restarts the silence timer: UCX also wakes the event fd for
      // its own traffic (retries, keepalives to an unreachable peer), which is no sign of life.
      if (*handled) {
        deadline = Clock::now() + options.timeout;
      } else if (Clock::now() >= deadline) {
        std::string waiting = ended ? "acknowledgements" : "the sender or releases";
        std::string slow;
        for_each_peer([&](const Peer& p) {
          if (!p.acked) slow += (slow.empty() ? "" : ", ") + p.link.peer();
        });
        return timeout_error(
            fmt::format("round {}: nothing from {} or downstream ({}) for "
                        "{} ms while waiting for {}",
                        round, upstream.peer(), slow, options.timeout.count(), waiting));
      }
    }
  }

  Result<RoundStats> run() {
    if (!broken.ok()) {
      return failed_precondition("the session failed earlier: " + broken.to_string());
    }
    auto r = relay_round();
    if (!r.ok()) {
      return fail(Status(r.status().code(), fmt::format("relay {}: {}", id, r.status().message())));
    }
    return r;
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
  impl->interrupted = InterruptCheck(options);
  impl->id = relay_id;
  // One UCX context for upstream and downstream relays, so one wait loop hears both.
  std::shared_ptr<net::Context> context;
  if (!relays_address.empty()) {
    FERRY_ASSIGN_OR_RETURN(context, net::Context::create());
  }
  auto link = connect_upstream(upstream, options, context);
  if (!link.ok()) return link.status();
  impl->upstream = std::move(*link);
  impl->poller = impl->upstream.channel().poller();
  impl->conversation =
      wire::Conversation(wire::Conversation::Role::kReceiver, impl->upstream.peer(), 0);
  wire::Message hello;
  hello.body = wire::Hello{relay_id, static_cast<std::uint32_t>(::getpid())};
  Status s = impl->upstream.send(wire::encode(hello), options.timeout);
  if (!s.ok()) return s;
  auto got = impl->upstream.receive(options.timeout);
  if (!got.ok()) return got.status().with_context("waiting for WELCOME");
  auto m = impl->decode_upstream(*got);
  if (!m.ok()) {
    return Status(m.status().code(),
                  fmt::format("{} turned relay {} away: {}", impl->upstream.peer(), relay_id,
                              m.status().message()));
  }
  const auto& w = std::get<wire::Welcome>(m->body);
  s = check_ring_size(options, impl->upstream.peer(), fmt::format("relay {}", relay_id), w.slots,
                      w.slot_bytes);
  if (!s.ok()) return s;
  SyncOptions local_options = options;
  local_options.checksums = w.checksums != 0;  // local receivers check what the sender sums
  auto fanout = Fanout::create(local_address, local_options, w.slots, w.slot_bytes);
  if (!fanout.ok()) return fanout.status();
  impl->local = std::move(*fanout);
  impl->local->set_session(m->session);
  impl->local->set_round(m->round);
  impl->local->set_peer_noun("local receiver");
  if (!relays_address.empty()) {
    FERRY_ASSIGN_OR_RETURN(impl->relays, Fanout::create_over(relays_address, local_options,
                                                             &impl->local->ring(), context));
    impl->relays->set_session(m->session);
    impl->relays->set_round(m->round);
    impl->relays->set_peer_noun("relay");
  }
  FERRY_ASSIGN_OR_RETURN(impl->ring_region,
                         impl->upstream.channel().register_memory(std::span(
                             impl->local->ring().slot(0), std::size_t{w.slots} * w.slot_bytes)));
  return std::unique_ptr<Relay>(new Relay(std::move(impl)));
}

Status Relay::accept(std::uint32_t local_receivers, std::uint32_t downstream_relays) {
  if (!impl_->broken.ok()) return impl_->broken;
  if (downstream_relays > 0 && !impl_->relays) {
    return failed_precondition(
        fmt::format("relay {}: accept({} downstream relays) needs a relays address at connect()",
                    impl_->id, downstream_relays));
  }
  Status s = impl_->local->accept(local_receivers);
  if (s.ok() && downstream_relays > 0) s = impl_->relays->accept(downstream_relays);
  if (!s.ok()) {
    // Upstream hears why this relay will not serve the round, naming it.
    return impl_->fail(Status(s.code(), fmt::format("relay {}: {}", impl_->id, s.message())));
  }
  return s;
}

Result<RoundStats> Relay::relay_round() {
  if (impl_->local->peers().empty() && (!impl_->relays || impl_->relays->peers().empty())) {
    return failed_precondition("relay_round: no local receiver or downstream relay has joined");
  }
  return impl_->run();
}

std::uint64_t Relay::session_id() const { return impl_->conversation.session(); }
const std::string& Relay::local_address() const { return impl_->local->address(); }
const std::string& Relay::relays_address() const {
  static const std::string kNone;
  return impl_->relays ? impl_->relays->address() : kNone;
}

}  // namespace ferry::sync

// Relay: upstream it is one receiver of a session on another node (a RoundReader that
// verifies each segment into a ring of its own but delivers none); downstream it is the
// sender of the same session to its local receivers (a Fanout) and, in a chain or tree, to
// relays (a second Fanout), both serving the reader's ring and driven as one (FanoutSet).
// Each side may be on any transport but upstream's, which must not share memory: the ring
// the relay serves is its own. Messages pass through unchanged, so the round checksum every
// end computes is the same.
#include <fmt/format.h>

#include "base/status_macros.h"
#include "ferry/sync.h"
#include "profiler/span.h"
#include "sync/fanout.h"
#include "sync/fanout_set.h"
#include "sync/join.h"
#include "sync/link.h"
#include "sync/round_reader.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace ferry::sync {

struct Relay::Impl {
  std::uint32_t id = 0;
  // Made once for upstream and both fanouts, so one wait loop hears all their channels.
  std::unique_ptr<transport::Registry> transports;
  // Reads upstream's rounds into this node's ring, verified, and owns the ring: before the
  // fanouts that serve it, so it outlives them.
  std::unique_ptr<RoundReader> upstream;
  // Downstream relays first (their copy crosses a network, the local ones' only memory).
  FanoutSet below;
  Fanout* local = nullptr;
  Fanout* relays = nullptr;  // nullptr: none served

  // Downstream hears first (it costs at most 100 ms a peer); then upstream gets the report
  // and the time to read it (the reader lingers) before this relay closes the link.
  // An error the reader met is already named and was already told upstream.
  Status fail(Status why) {
    const Status& broken = upstream->status();
    below.fail(broken.ok() ? Status(why.code(), fmt::format("relay {}: {}", id, why.message()))
                           : broken);
    return upstream->abort(std::move(why));
  }
};

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Relay::~Relay() = default;

Result<std::unique_ptr<Relay>> Relay::connect(const std::string& upstream, std::uint32_t relay_id,
                                              const std::string& local_address,
                                              const SyncOptions& options,
                                              const std::string& relays_address) {
  if (options.timeout.count() <= 0) return invalid_argument("timeout must be positive");
  auto impl = std::make_unique<Impl>();
  impl->id = relay_id;
  impl->transports = std::make_unique<transport::Registry>(transport_config(options));
  transport::Registry& transports = *impl->transports;
  // Every address is checked (an unknown scheme named) before upstream is joined.
  FERRY_RETURN_IF_ERROR(transports.for_address(local_address).status());
  if (!relays_address.empty()) {
    FERRY_RETURN_IF_ERROR(transports.for_address(relays_address).status());
  }
  FERRY_ASSIGN_OR_RETURN(const transport::Transport* in, transports.for_address(upstream));
  if (in->shares_memory()) {
    return invalid_argument(fmt::format(
        "relay upstream '{}' is not a host:port address: it shares this node's memory, so its "
        "receivers can map the sender's ring without a relay",
        upstream));
  }
  FERRY_ASSIGN_OR_RETURN(
      impl->upstream, join_session(upstream, JoinAs{"relay", relay_id, 0, &transports}, options));
  RoundReader& reader = *impl->upstream;
  reader.set_name(fmt::format("relay {}", relay_id));
  impl->below = FanoutSet(options, reader.poller());
  SyncOptions below_options = options;
  below_options.checksums = reader.checksums();  // the peers below check what the sender sums
  if (!relays_address.empty()) {
    FERRY_ASSIGN_OR_RETURN(impl->relays, impl->below.add(relays_address, below_options,
                                                         &reader.ring(), transports, "relay"));
  }
  FERRY_ASSIGN_OR_RETURN(impl->local, impl->below.add(local_address, below_options, &reader.ring(),
                                                      transports, "local receiver"));
  impl->below.set_session(reader.session_id(), reader.last_round());
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
  if (impl_->below.no_peers()) {
    return failed_precondition("relay_round: no local receiver or downstream relay has joined");
  }
  profiler::Span round_span("sync.relay_round");
  auto begun = impl_->upstream->begin(ReadInto::kPassThrough);
  Status s = begun.ok() ? impl_->below.forward_round(*impl_->upstream) : begun.status();
  if (!s.ok()) return impl_->fail(s);
  return impl_->upstream->stats();
}

std::uint64_t Relay::session_id() const { return impl_->upstream->session_id(); }
const std::string& Relay::local_address() const { return impl_->local->address(); }
const std::string& Relay::relays_address() const {
  static const std::string kNone;
  return impl_->relays ? impl_->relays->address() : kNone;
}

}  // namespace ferry::sync

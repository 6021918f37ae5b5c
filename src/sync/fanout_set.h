// Several Fanouts over one ring, driven as one, fed the rounds of a pass-through RoundReader:
// a Relay's downstream, its local receivers and its downstream relays. A set, not
// one Fanout with several listeners: each member keeps its own listener, transport,
// registered region and peer noun, and Fanout stays the one-listener object a Sender's
// RoundWriter drives. What spans the members lives here: send to all, the buckets every peer
// released, every peer's ACK, one wait that hears them all beside the reader's link, and
// telling all of a failure; so a relay is a reader feeding this, with no loop of its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "sync/fanout.h"
#include "sync/round_reader.h"
#include "sync/sync_options.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace ferry::sync {

class FanoutSet {
 public:
  FanoutSet() = default;
  // `poller`: the wait loop that hears every member and the reader's link (a Relay's
  // upstream; its members serve on the transports of that link, so one loop hears all).
  FanoutSet(const SyncOptions& options, std::unique_ptr<transport::Poller> poller);

  // A member serving `ring` (owned elsewhere, outliving the set) on `address`, its peers
  // named `noun` in errors, on the transport `transports` picks for `address`. Messages go
  // to members in the order they were added.
  Result<Fanout*> add(const std::string& address, const SyncOptions& options, transport::Ring* ring,
                      transport::Registry& transports, std::string noun);
  void set_session(std::uint64_t session, std::uint64_t round);
  bool no_peers() const;

  // Passes the round `from` began (ReadInto::kPassThrough) to every peer: each message as it
  // came, a segment only once `from` verified it. Bucket b goes back upstream once every peer
  // released b (a relay's RELEASE says its whole subtree has b), the ACK once every peer
  // acknowledged with the checksum `from` computed. Fails on `from`'s error, a peer's (named),
  // options.interrupt, or options.timeout with no word from anyone.
  Status forward_round(RoundReader& from);
  // Tells every peer of every member, in order (best effort), and closes them.
  void fail(const Status& why);

 private:
  Status send_all(const RoundReader& from);
  std::uint32_t released(std::uint32_t buckets) const;
  bool all_acked() const;
  // Waits for news: true once `from` has a message waiting (asked first: what it has is what
  // the peers wait for), false once a peer's RELEASE or ACK was counted.
  Result<bool> wait(RoundReader& from, std::string_view waiting_for);

  SyncOptions options_;
  InterruptCheck interrupted_;
  std::unique_ptr<transport::Poller> poller_;
  std::vector<std::unique_ptr<Fanout>> members_;
};

}  // namespace ferry::sync

// The downstream side of a session: the peers one ring serves. A Sender's peers are its
// receivers (shm, same node) or relays and remote receivers (net); a Relay has two, its
// local receivers and its downstream relays (each on any transport), driven as one by a FanoutSet
// (fanout_set.h). Both publish segments, wait for RELEASE and ACK, and turn a dead, silent or
// misbehaving peer into an error that names it and the round.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "sync/link.h"
#include "sync/sync_options.h"
#include "transport/registry.h"
#include "transport/transport.h"
#include "wire/conversation.h"
#include "wire/message.h"

namespace ferry::sync {

struct Peer {
  Link link;
  wire::Conversation conversation{wire::Conversation::Role::kSender, "", 0};
  std::uint32_t id = 0;
  std::uint32_t released = 0;  // buckets released this round
  bool acked = false;
};

class Fanout {
 public:
  // Listens on `address` (shm "@name" or path; net "host:port") for peers of `session`
  // and has the transport allocate the ring they share: peers sharing memory map it; it is
  // registered with the transport for the others (their segments are sent from it).
  static Result<std::unique_ptr<Fanout>> create(const std::string& address,
                                                const SyncOptions& options, std::uint32_t slots,
                                                std::uint64_t slot_bytes);
  // A Fanout over a ring owned elsewhere (which must outlive this one): a Relay serves its
  // local receivers and downstream relays the ring its upstream reader fills, with no copy.
  // `transports`: the relay's, shared with its upstream, so one wait loop serves all.
  static Result<std::unique_ptr<Fanout>> create_over(const std::string& address,
                                                     const SyncOptions& options,
                                                     transport::Ring* ring,
                                                     transport::Registry& transports);

  void set_session(std::uint64_t session) { session_ = session; }
  std::uint64_t session() const { return session_; }
  void set_round(std::uint64_t round) { round_ = round; }
  std::uint64_t round() const { return round_; }
  // How peers are named in errors ("receiver" for a Sender's, "local receiver" for a Relay's).
  void set_peer_noun(std::string noun) { noun_ = std::move(noun); }

  // Waits for `n` more peers, each within options.timeout. A peer of another session,
  // a duplicate id or a failed authentication is turned away, and serving goes on; so is
  // (shm) a peer of another user, or one that connects and says nothing: each connected
  // peer has its own options.timeout to say HELLO, and waits beside the others. A peer
  // that joined and left again before its first round (shm sees it) is not counted, and
  // its id is free again.
  Status accept(std::uint32_t n);

  wire::Message message(wire::Body body) const;
  // Sends to every peer; FILLED also publishes the segment's bytes to peers that do not
  // share memory.
  Status send_all(const wire::Message& m);
  Status send_all_bytes(const std::vector<std::byte>& bytes, const wire::Message& m);
  // Reads peers' messages until every peer satisfies `done`, failing if none says
  // anything for a whole timeout. `on_message` (may be empty) sees each accepted one.
  Status wait_until(const std::function<bool(const Peer&)>& done, std::uint64_t round_checksum,
                    const char* waiting_for);
  // Moves what the transport's engine holds queued (segments on their way to peers that do
  // not share memory) without waiting: a writer calls it between copies, so the wire does
  // not stand still while the next segment is packed.
  Status keep_moving();
  // Waits for every published segment to be sent (after the round's ACKs).
  Status drain_transfers();
  // Tells every peer the session is over (best effort) and closes them.
  Status fail(Status why);
  // Forgets every peer (after fail()), so that a new session can accept them again.
  void drop_peers() { peers_.clear(); }

  std::vector<Peer>& peers() { return peers_; }
  const std::vector<Peer>& peers() const { return peers_; }
  // True when every peer maps the ring (shm on this node): no segment crosses a link.
  bool all_peers_share_memory() const;
  transport::Ring& ring() { return *ring_; }
  const std::string& address() const { return address_; }

  // The receive loop, for wait_until and a caller's own (a Relay also waits on its
  // upstream). After the Poller's progress(): handles the messages that arrived from every
  // peer and forgets finished segment sends; true if any message came. A peer that
  // satisfies `done` is read too, so its report is heard now, but its failure to read is not
  // an error.
  Result<bool> handle_arrived(const std::function<bool(const Peer&)>& done,
                              std::uint64_t round_checksum);
  // Appends the poll_fd() of each peer that owes something (-1 for the rest): what the
  // Poller's wait() watches beside its engine.
  void add_poll_fds(const std::function<bool(const Peer&)>& done,
                    std::vector<struct pollfd>* fds) const;

 private:
  // A peer that connected and has until `deadline` to say HELLO.
  struct PendingPeer {
    Link link;
    std::chrono::steady_clock::time_point deadline;
  };
  // More silent connections than this and the oldest is dropped.
  static constexpr std::size_t kMaxPendingPeers = 64;

  Status accept_one();
  // One turn of accept_one(): true once a peer was admitted.
  Result<bool> admit_pending(std::chrono::milliseconds wait);
  Status admit(Peer p, const std::vector<std::byte>& hello);
  void drop_peers_that_left(std::size_t from);
  Status handle(Peer& p, const wire::Message& m, std::uint64_t round_checksum);
  Status explain_send_failure(Peer& p, Status failed);
  // `s`, a failure of peer `p`'s link, as "round N: <peer>: <what>".
  Status peer_error(const Peer& p, const Status& s) const;
  Status reap(Peer& p);

  SyncOptions options_;
  InterruptCheck interrupted_;  // set with options_ in create()
  std::uint64_t session_ = 0;
  std::uint64_t round_ = 0;
  std::string noun_ = "receiver";
  std::string address_;
  std::unique_ptr<transport::Listener> listener_;
  std::unique_ptr<transport::Poller> poller_;  // the listener's channels' wait loop
  std::unique_ptr<transport::Ring> owned_ring_;
  transport::Ring* ring_ = nullptr;  // owned_ring_, or create_over()'s
  // The ring registered for segments (nullptr: peers share memory); after ring_, so it is
  // deregistered before the ring is unmapped.
  std::unique_ptr<transport::Region> ring_region_;
  std::vector<Peer> peers_;
  std::vector<PendingPeer> pending_;
};

}  // namespace ferry::sync

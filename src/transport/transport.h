// The seam between sync and the transports. A Channel carries whole control messages, in
// order, to one peer, with a timeout on each call; a dead peer is kAborted naming it, silence
// is kTimeout. A Listener is bound to an address and accepts Channels. Two transports
// implement both, in mirrored folders: shm/ (a UNIX socket to a process on this node, which
// maps the sender's ring) and net/ (UCX to another node, which gets each segment's bytes sent
// to it: publish_segment / receive_segment). Callers branch on the capability queries, never
// on which transport they hold. A Transport (one per kind, made once from a TransportConfig)
// makes both; a Registry (registry.h) picks it by the address's scheme.
//
// Like the transports, a Transport, Channel, Listener or Poller is used by one thread at a
// time.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "ferry/status.h"
#include "ferry/wire_protect.h"
#include "transport/ring.h"

namespace ferry::transport {

// The largest control message every transport carries: a body of 64 MiB and a header of up
// to 28 bytes. The protocol above (wire/) keeps its messages within it (sync/link.cc checks
// at compile time); the value is on the wire, as net's frame limit, so it never shrinks.
inline constexpr std::size_t kMaxMessageBytes = (64u << 20) + 28;

// Memory registered with a transport for segments (the ring), so that their bytes travel
// without a copy. Opaque; deregistered when destroyed, so it must go before the memory does.
// Transports that share memory register nothing (register_memory answers nullptr).
class Region {
 public:
  virtual ~Region() = default;
};

// The one wait loop of a thread serving channels beside other fds. Each turn: progress()
// runs the transport's progress engine, the caller then looks at every channel
// (try_receive, check_segments), and wait() sleeps until the engine or one of the caller's
// fds (the channels' poll_fd() among them) has news. Without an engine, wait() is a plain
// poll().
class Poller {
 public:
  virtual ~Poller() = default;
  // Runs the engine until it has nothing left to do; true if it did anything.
  virtual bool progress() = 0;
  // Sleeps until one of `fds` is ready (fd < 0 skipped, as by poll()), the engine has events
  // (unless `watch_engine` is false: none of the engine's channels owes anything), or
  // `timeout` passes. Returns how many of `fds` are ready; 0 also after a wakeup by the
  // engine alone or a signal. An error only when poll() itself fails.
  virtual Result<int> wait(std::vector<pollfd>& fds, std::chrono::milliseconds timeout,
                           bool watch_engine = true) = 0;
};

// A Poller with no engine: wait() is poll() over the caller's fds.
std::unique_ptr<Poller> plain_poller();

class Channel {
 public:
  virtual ~Channel() = default;

  // Capabilities.
  // The peer maps memory this end passes it (the ring), so segments need no bytes sent;
  // false: each segment's bytes travel as a bulk message (net::Channel::send_bulk).
  virtual bool shares_memory() const = 0;
  // send_with_fd / receive_with_fd carry a descriptor with the message.
  virtual bool passes_fds() const = 0;

  // Sends one whole message (at most kMaxMessageBytes); waits at most `timeout` for room.
  virtual Status send(std::span<const std::byte> message, std::chrono::milliseconds timeout) = 0;
  // passes_fds() only (else kFailedPrecondition): sends `fd` with the message.
  virtual Status send_with_fd(std::span<const std::byte> message, std::chrono::milliseconds timeout,
                              int fd);
  // Waits for one whole message; a negative timeout waits forever.
  virtual Result<std::vector<std::byte>> receive(std::chrono::milliseconds timeout) = 0;
  // The same; a descriptor passed with the message (passes_fds() only) lands in *fd.
  virtual Result<std::vector<std::byte>> receive_with_fd(std::chrono::milliseconds timeout,
                                                         ScopedFd* fd);
  // The receive loop's read (after Poller::progress() and wait()): a message that arrived,
  // if any, without waiting for one. A message that has begun to arrive is read whole,
  // waiting at most `rest_within` for its rest (shm: a long message comes in chunks), else
  // kTimeout naming the peer. A peer gone is kAborted, as from receive().
  virtual Result<std::optional<std::vector<std::byte>>> try_receive(
      std::chrono::milliseconds rest_within) = 0;
  // What the receive loop polls for this channel beside its Poller: its own socket, or -1
  // when the Poller's engine reports its messages (net).
  virtual int poll_fd() const = 0;

  virtual int fd() const = 0;
  virtual bool valid() const = 0;
  // Closes after flushing what was sent (the peer sees kAborted).
  virtual void close() = 0;
  // Closes at once, without lingering to flush: for a session that already failed.
  virtual void abort() = 0;
  // How errors name the peer; set_peer renames it once it has said who it is.
  virtual const std::string& peer() const = 0;
  virtual void set_peer(std::string peer) = 0;
  // For logs: where the peer is ("host:port"), and how its bytes travel ("tcp/lo",
  // "rc_mlx5/mlx5_0:1 sysv/memory"); both empty for a peer on this node.
  virtual std::string peer_address() const { return {}; }
  virtual std::string transports() const { return {}; }
  // The wait loop for this channel (and the others of its engine).
  virtual std::unique_ptr<Poller> poller() const { return plain_poller(); }

  // Sending without blocking, for a server that must wait on no one peer (the replicate
  // server). post() queues one whole message (at most kMaxMessageBytes) behind those posted
  // before and hands on what the peer takes now; flush_posted() hands on more. Both answer
  // how many posted messages are still queued: a peer that stopped reading keeps it above 0,
  // and it is the caller's to bound how long. A message is never cut: a send() that times
  // out may leave one cut on some transports (shm), so do not mix send() with post().
  // Where an engine carries the channel (net), it moves what is queued (Poller::progress).
  virtual Result<std::size_t> post(std::vector<std::byte> message) = 0;
  virtual Result<std::size_t> flush_posted() = 0;

  // Segments: the bytes of one bucket, from the sender's ring into the receiver's. A peer
  // that shares_memory() maps the ring and needs none of these (the calls below then do
  // nothing and answer OK); the others get each segment's bytes sent, in the order both
  // ends publish and receive them.
  //
  // Registers the memory segments are sent from or received into (the ring), once.
  virtual Result<std::unique_ptr<Region>> register_memory(std::span<std::byte> memory);
  // Starts sending `bytes`, which lie in `region`, as the next segment. Never blocks; many
  // may be in flight, kept by the channel until they finish.
  virtual Status publish_segment(std::span<const std::byte> bytes, const Region* region);
  // Forgets the segment sends that finished; the error of one that failed (the peer is gone).
  // Does not block or progress the engine (the caller's Poller does).
  virtual Status check_segments();
  // Waits until every published segment is sent (kTimeout naming the peer past `timeout`).
  virtual Status await_segments(std::chrono::milliseconds timeout);
  // Receives the peer's next segment into `into`, which lies in `region`, waiting at most
  // `timeout` (kTimeout naming the peer). A segment of another size is kCorruption.
  virtual Status receive_segment(std::span<std::byte> into, const Region* region,
                                 std::chrono::milliseconds timeout);
};

// Bound to an address, accepts the Channels that connect() opens to it.
class Listener {
 public:
  virtual ~Listener() = default;

  // Waits up to `timeout` (negative: forever; 0: one nonblocking step) for one peer;
  // kTimeout when none came. A peer refused (another user, a wrong token) is logged and
  // the wait goes on.
  virtual Result<std::unique_ptr<Channel>> accept(std::chrono::milliseconds timeout) = 0;
  // Readable when accept() may have progress to make.
  virtual int fd() const = 0;
  // The address it is bound to, as peers connect to it ("127.0.0.1:40123" for a port 0).
  virtual const std::string& address() const = 0;
  // Stops listening (an shm socket file is removed); accepted channels live on.
  virtual void close() = 0;
  // As Channel::register_memory, for the channels it accepts (nullptr when they share
  // memory).
  virtual Result<std::unique_ptr<Region>> register_memory(std::span<std::byte> memory) = 0;
  // The wait loop for the channels it accepts.
  virtual std::unique_ptr<Poller> poller() const = 0;
};

// What every transport of one end is made from; each reads what it needs.
struct TransportConfig {
  // The session secret, for transports that authenticate peers (net): this file (mode 0600);
  // empty: FERRY_TOKEN, else the file FERRY_TOKEN_FILE names. Read when such a transport is
  // made, so an end on this node alone needs none.
  std::string secret_file;
  // How segments between nodes are protected: a listener's channels publish them this way,
  // a connecting channel accepts no weaker (the sender chooses). Ignored on this node (shm).
  WireProtect protection = WireProtect::kNone;
  // net: every message is copied into the engine's buffers, never sent zero-copy
  // (net::ContextOptions::copy_sends): for an end that sends to untrusted peers, which may
  // end mid-message, and needs no top speed (the replicate server). Halves net's bulk rate.
  // Ignored by transports that never send from the caller's memory (shm).
  bool copy_sends = false;
  // The session secret itself, for callers handed it in their options (NetGroupOptions::
  // token); when set, secret_file and the environment are not read.
  std::string secret;
  // Several threads use what it makes, one at a time under the caller's mutex (a rank
  // group's collectives and fetches): net then makes its UCX worker thread-serialized.
  bool serialized = false;
  // Called with the reason for each peer a listener refuses (net: a failed handshake),
  // after it is logged: for callers that list refusals in their own timeout error. Called
  // on the thread in accept().
  std::function<void(const Status&)> on_refused;
};

// One way to reach peers (as gloo's transport::Device): shm to processes on this node, net
// (UCX) to other nodes. Made once per end from a TransportConfig (Registry); the listeners
// and channels it makes share what it holds (net: one UCX Context, so one Poller hears all).
// Not copyable; what it made outlives it.
class Transport {
 public:
  virtual ~Transport() = default;

  // The registry's name for it ("shm", "net"), for errors and logs.
  virtual const std::string& scheme() const = 0;

  // Capabilities.
  // Its channels share memory with the peer (Channel::shares_memory): a ring a peer passes
  // is mapped (map_peer_ring), not filled by segments.
  virtual bool shares_memory() const = 0;
  // connect() may be cut into slices: a kTimeout leaves nothing behind, so the caller can
  // retry and hear Ctrl-C between tries. false: connect() keeps its own deadline (net: a
  // handshake cut short would count against the listener's limits).
  virtual bool connect_in_slices() const = 0;

  // Binds a listener at `address` (port 0: an ephemeral one; see Listener::address()). An
  // address in use is an error naming it.
  virtual Result<std::unique_ptr<Listener>> listen(const std::string& address) = 0;
  // Connects to the listener at `address`, retrying while nobody listens there, within
  // `timeout` (then kTimeout naming the address). Errors name the listener "<role> at
  // <address>": the rank groups connect to ranks, not to senders.
  virtual Result<std::unique_ptr<Channel>> connect(const std::string& address,
                                                   std::chrono::milliseconds timeout,
                                                   const std::string& role) = 0;
  Result<std::unique_ptr<Channel>> connect(const std::string& address,
                                           std::chrono::milliseconds timeout) {
    return connect(address, timeout, "sender");
  }
  // A ring of `slots` x `slot_bytes` that this end writes (a sender) or has segments
  // received into (Channel::register_memory makes it a Region).
  virtual Result<std::unique_ptr<Ring>> allocate_ring(std::uint32_t slots,
                                                      std::uint64_t slot_bytes) = 0;
  // shares_memory() only (else kFailedPrecondition): maps read-only the ring `peer` passed
  // with its message (`fd`), after checking its size.
  virtual Result<std::unique_ptr<Ring>> map_peer_ring(ScopedFd fd, std::uint32_t slots,
                                                      std::uint64_t slot_bytes,
                                                      const std::string& peer);
  // The address a peer reaches a listener of this transport at: `listening` (its
  // Listener::address()) as it is, unless it names every interface (net: 0.0.0.0 or [::]);
  // then with the host of `via`: an address of this end that the peer reached, or the
  // peer's address as this end sees it (Channel::peer_address()). kFailedPrecondition when
  // `via` names no host.
  virtual Result<std::string> reachable_address(const std::string& listening,
                                                const std::string& via) const;
  // shares_memory() only (else kFailedPrecondition): copies into.size() bytes at `offset` of
  // the memory `peer` passed with a message (`fd`) into `into`, without mapping it: for
  // bytes read once (a rank group's fetch answer), where a mapping costs more than the copy.
  virtual Status read_peer_memory(const ScopedFd& fd, std::uint64_t offset,
                                  std::span<std::byte> into, const std::string& peer);
};

}  // namespace ferry::transport

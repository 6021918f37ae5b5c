// The net transport's channel to one peer, its listener and connect().
//
// A Channel has the shape of shm::Channel: whole control messages, in order, sent and
// received with a timeout; a dead peer is kAborted naming it, silence is kTimeout. Its
// control path is a stream of length-prefixed frames, each sealed with AES-256-GCM under a
// per-session, per-direction key and a counter nonce: a frame tampered with, replayed,
// reordered, dropped or reflected fails the channel as kCorruption. Each bulk message is
// announced by a sealed frame that carries its protection (WireProtect) and tag. What
// carries them is the Context's NetPath: on kTcp (the default) the authenticated TCP socket
// carries the frames and, by rendezvous, the bulk bytes (tcp_stream.cc); on kUcx a UCX stream
// carries the frames and tagged sends move bulk from registered memory into registered
// memory on the peer. Before either carries a byte the two ends have authenticated each
// other (auth.h): a Channel only exists once that has succeeded.
//
// Single-threaded, like Context: the thread that owns the Context uses its channels.
#pragma once

#include <ucp/api/ucp_def.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "ferry/status.h"
#include "ferry/wire_protect.h"
#include "transport/net/auth.h"
#include "transport/net/context.h"
#include "transport/net/seal.h"
#include "transport/net/testing.h"

namespace ferry::net {

// The largest control message: transport::kMaxMessageBytes.
std::size_t max_message_bytes();

struct Endpoint;  // endpoint.h
struct TcpOp;     // endpoint.h

// One bulk send or receive in flight. Move-only. Destroying one that has not finished
// cancels it (receives) or waits a bounded time for it (sends).
class Transfer {
 public:
  Transfer() = default;
  Transfer(Transfer&& o) noexcept;
  Transfer& operator=(Transfer&& o) noexcept;
  ~Transfer();

  // Whether it finished (well or not). Does not progress the worker: the caller's loop
  // calls Context::progress(). A transfer whose peer died finishes as kAborted.
  bool done();
  // REQUIRES: done(). kAborted naming the peer when it died; kCorruption when a received
  // message did not fit the buffer or failed authentication (mac, encrypt);
  // kFailedPrecondition when the sender protected it less than this end requires.
  const Status& status() const { return status_; }
  // Bytes received (receives) or sent (sends), once done() and ok.
  std::size_t bytes() const { return bytes_; }
  std::uint32_t key() const { return key_; }

 private:
  friend class Channel;
  void finish(ucs_status_t st, std::size_t length);
  void release();
  std::shared_ptr<Endpoint> endpoint_;
  std::shared_ptr<TcpOp> op_;  // ferry's TCP path; UCX's uses request_
  void* request_ = nullptr;
  bool receive_ = false;
  bool finished_ = false;
  bool cancelled_ = false;
  bool arrived_ = false;  // a receive's bytes are here, not yet checked
  std::uint32_t key_ = 0;
  std::size_t expected_ = 0;
  std::size_t bytes_ = 0;
  std::byte* into_ = nullptr;       // a receive's buffer (decrypted in place)
  std::vector<std::byte> staging_;  // an encrypted send's ciphertext, until UCX is done
  Status status_;
};

class Channel {
 public:
  Channel() = default;
  // Made by Listener::accept and connect() (Endpoint is internal to channel.cc).
  explicit Channel(std::shared_ptr<Endpoint> endpoint) : endpoint_(std::move(endpoint)) {}
  Channel(Channel&&) noexcept = default;
  Channel& operator=(Channel&&) noexcept = default;
  ~Channel();

  // Sends one whole message (at most max_message_bytes()). Returns once UCX has taken it;
  // waits at most `timeout` for that (a peer that stopped reading).
  Status send(std::span<const std::byte> message, std::chrono::milliseconds timeout);
  // Waits for one whole message; a negative timeout waits forever. A dead peer is kAborted,
  // no message in time kTimeout; both name the peer. Messages that arrived before the peer
  // died are still delivered first.
  Result<std::vector<std::byte>> receive(std::chrono::milliseconds timeout);
  // A message if one has arrived whole, std::nullopt if not; for the caller's poll() loop
  // (call Context::progress() first). Errors as receive().
  Result<std::optional<std::vector<std::byte>>> try_receive();

  // How this end protects the bulk messages it sends (default kNone), and the least it
  // accepts on those it receives (default kNone): a weaker one fails its Transfer with
  // kFailedPrecondition. The sender's choice travels in sealed frames, so nobody on the
  // path can lower it. Set before the first bulk message.
  void set_bulk_protection(WireProtect send, WireProtect minimum_received);

  // Starts sending `data`, which lies in `region`, as bulk message `key`, matched by the
  // peer's receive_bulk with the same key. Never blocks; many may be in flight. Under
  // kMac the bytes are read once more for their tag; under kEncrypt they are encrypted
  // into a buffer of the Transfer's own (`region` then unused), so `data` is never changed.
  Result<Transfer> send_bulk(std::uint32_t key, std::span<const std::byte> data,
                             const MemoryRegion& region);
  // Starts receiving bulk message `key` straight into `into`, which lies in `region`; it may
  // be posted before or after the peer sends. At most one pending receive per key. The
  // Transfer is done only once the bytes are checked (and decrypted) as the sender
  // announced them.
  Result<Transfer> receive_bulk(std::uint32_t key, std::span<std::byte> into,
                                const MemoryRegion& region);
  // Progresses until `t` is done, the peer dies or `timeout` passes (kTimeout naming the peer
  // and the key). A negative timeout waits forever.
  Status wait(Transfer& t, std::chrono::milliseconds timeout);

  // Messages given to send() that UCX has not finished sending (a send() that timed out
  // leaves its message queued, not cancelled): a peer that stopped reading keeps this up.
  std::size_t sends_in_flight() const;
  // OK while the peer is alive; otherwise the error that ended it.
  Status health() const;
  bool valid() const { return endpoint_ != nullptr; }
  // Closes the endpoint: flushes what was sent, then disconnects (the peer sees kAborted).
  void close();
  // Closes at once, without the FIN and flush that close() waits for: for a session that
  // already failed, where the peer may be unreachable. Transfers in flight are cancelled.
  void abort();
  // For Listener and connect(): whether UCX has finished wiring the new endpoint up (a
  // flush posted on the first call has completed). Until then UCX keeps the worker's event
  // fd readable, so a Channel is handed out only after this says true. kAborted when the
  // peer went away first. Does not progress the worker.
  Result<bool> wired_up();
  // The event fd to poll (the Context's: shared by all its channels).
  int fd() const;
  Context& context() const;
  const std::string& peer() const;
  // What UCX chose for this endpoint, e.g. "tcp/lo" (also logged at connect).
  const std::string& transports() const;

 private:
  friend Status testing::send_frame(Channel&, std::uint8_t, std::span<const std::byte>);
  std::shared_ptr<Endpoint> endpoint_;
};

struct ListenerOptions {
  // How long an accepted peer may take over the handshake; a silent peer costs at most this.
  std::chrono::milliseconds handshake_timeout{5000};
  // Handshakes in progress at once, and from one source address (IP): a peer past either
  // limit is closed at once. Silent peers cannot keep others out beyond these.
  std::size_t max_handshakes = 64;
  std::size_t max_handshakes_per_source = 8;
  // Called with the reason for each refused peer (after it is logged); for tests and for
  // callers that list refusals in their own timeout error. Unset: only the log.
  std::function<void(const Status&)> on_refused;
};

// A TCP listener on "host:port" (port 0: an ephemeral port; see address()). Peers
// authenticate on the TCP socket (auth.h); only an authenticated peer gets a UCX endpoint,
// made from the worker addresses the two sides then exchange. No UCX code reads a byte of
// an unauthenticated peer. Several handshakes run at once, each with a deadline.
class Listener {
 public:
  static Result<Listener> bind(std::shared_ptr<Context> context, const std::string& address,
                               Token token, ListenerOptions options = {});
  Listener();
  Listener(Listener&&) noexcept;
  Listener& operator=(Listener&&) noexcept;
  ~Listener();

  // Waits up to `timeout` (negative: forever; 0: one nonblocking step) for one peer to
  // finish authenticating. A peer that fails (wrong or no token, garbage, silence past
  // handshake_timeout, gone) is logged as a warning, closed, and does not end the wait: a
  // hostile peer's error is never returned. kTimeout when none authenticated in time;
  // other errors only for failures of this process (epoll, UCX).
  Result<Channel> accept(std::chrono::milliseconds timeout);
  // The bound address with its real port, e.g. "127.0.0.1:40123".
  const std::string& address() const;
  // Readable when accept() may have progress to make (a new connection or handshake bytes):
  // an epoll fd over the listening socket and the handshakes in progress.
  int fd() const;
  // Handshakes in progress (for tests and logs).
  std::size_t handshakes() const;

  struct State;  // bootstrap.cc

 private:
  std::unique_ptr<State> state_;
};

struct ConnectOptions {
  // How errors name the listener: "<role> at host:port".
  std::string role = "sender";
};

// Connects over TCP to a Listener and authenticates both ways, retrying while the address
// refuses connections (nobody listens yet) or the listener closes us before answering (it
// is full), up to `timeout` in all. `token` nullopt: connect without one (the listener
// refuses; both sides report it).
Result<Channel> connect(std::shared_ptr<Context> context, const std::string& address,
                        const std::optional<Token>& token, std::chrono::milliseconds timeout,
                        const ConnectOptions& options = {});

// For Listener and connect(): the Channel to an authenticated peer, from its UCX worker
// address (verified: it came out of the peer's sealed ADDRESS frame), on `worker` (connect(): a
// worker of its own; nullptr: the context's main worker, the listener's). Takes over `local_bulk`
// (released with the channel, or here on failure). `keys`: this end's session keys
// (derive_session_keys) for the frames and bulk messages. `bootstrap` is the authenticated TCP
// socket to the peer, kept open for the channel's life: on kTcp it carries everything (`early`:
// bytes the handshake read from it past its last frame), on kUcx its end tells that the peer's
// process is gone.
Result<Channel> open_channel(const std::shared_ptr<Context>& ctx, std::shared_ptr<Worker> worker,
                             ScopedFd bootstrap, std::string peer,
                             const VerifiedWorkerAddress& remote_worker, std::uint32_t local_bulk,
                             std::uint32_t remote_bulk, const SessionKeys& keys,
                             std::vector<std::byte> early = {});

}  // namespace ferry::net

// The net transport's channel to one peer, its listener and connect().
//
// A Channel has the shape of shm::Channel: whole control messages, in order, sent and
// received with a timeout; a dead peer is kAborted naming it, silence is kTimeout. Its
// control path is a UCX stream (length-prefixed frames); its bulk path is tagged sends
// from registered memory straight into registered memory on the peer. Before either
// carries a byte the two ends have authenticated each other (auth.h): a Channel only
// exists once that has succeeded.
//
// Single-threaded, like Context: the thread that owns the Context uses its channels.
#pragma once

#include <ucp/api/ucp_def.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "transport/net/auth.h"
#include "transport/net/context.h"

namespace ferry::net {

// The largest control message: a wire header plus the largest wire body.
std::size_t max_message_bytes();

struct Endpoint;  // channel.cc

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
  // message did not fit the buffer.
  const Status& status() const { return status_; }
  // Bytes received (receives) or sent (sends), once done() and ok.
  std::size_t bytes() const { return bytes_; }
  std::uint32_t key() const { return key_; }

 private:
  friend class Channel;
  void finish(ucs_status_t st, std::size_t length);
  void release();
  std::shared_ptr<Endpoint> endpoint_;
  void* request_ = nullptr;
  bool receive_ = false;
  bool finished_ = false;
  bool cancelled_ = false;
  std::uint32_t key_ = 0;
  std::size_t expected_ = 0;
  std::size_t bytes_ = 0;
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

  // Starts sending `data`, which lies in `region`, as bulk message `key`, matched by the
  // peer's receive_bulk with the same key. Never blocks; many may be in flight.
  Result<Transfer> send_bulk(std::uint32_t key, std::span<const std::byte> data,
                             const MemoryRegion& region);
  // Starts receiving bulk message `key` straight into `into`, which lies in `region`; it may
  // be posted before or after the peer sends. At most one pending receive per key.
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
  // The event fd to poll (the Context's: shared by all its channels).
  int fd() const;
  Context& context() const;
  const std::string& peer() const;
  // What UCX chose for this endpoint, e.g. "tcp/lo" (also logged at connect).
  const std::string& transports() const;

 private:
  std::shared_ptr<Endpoint> endpoint_;
};

struct ListenerOptions {
  // How long an accepted peer may take over the handshake; a silent peer costs at most this.
  std::chrono::milliseconds handshake_timeout{5000};
};

// A ucp listener on "host:port" (port 0: an ephemeral port; see address()).
class Listener {
 public:
  static Result<Listener> bind(std::shared_ptr<Context> context, const std::string& address,
                               Token token, ListenerOptions options = {});
  Listener();
  Listener(Listener&&) noexcept;
  Listener& operator=(Listener&&) noexcept;
  ~Listener();

  // Waits up to `timeout` (negative: forever) for one peer and authenticates it. A peer that
  // fails authentication is refused (it is told so, and it is logged) and its error returned
  // as kUnauthenticated; the listener stays usable, so call accept() again.
  Result<Channel> accept(std::chrono::milliseconds timeout);
  // The bound address with its real port, e.g. "127.0.0.1:40123".
  const std::string& address() const;
  int fd() const;

  struct State;  // channel.cc

 private:
  std::unique_ptr<State> state_;
};

struct ConnectOptions {
  // How errors name the listener: "<role> at host:port".
  std::string role = "sender";
};

// Connects to a Listener and authenticates both ways, retrying while nobody listens yet, up
// to `timeout` in all. `token` nullopt: connect without one (the listener refuses; both
// sides report it).
Result<Channel> connect(std::shared_ptr<Context> context, const std::string& address,
                        const std::optional<Token>& token, std::chrono::milliseconds timeout,
                        const ConnectOptions& options = {});

}  // namespace ferry::net

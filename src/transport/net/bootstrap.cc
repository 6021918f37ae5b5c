// Listener and connect(): the TCP bootstrap. Peers authenticate on a plain TCP socket
// (auth.h's handshake), then swap UCX worker addresses on it, sealed under the session's
// keys: the connector's first, the listener's only once that one verified; only then does
// either side make a UCX endpoint. No UCX code handles a byte from an
// unauthenticated peer, nor an address whose tag did not verify.
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "transport/net/channel.h"
#include "transport/net/seal.h"
#include "transport/net/socket.h"

namespace ferry::net {
namespace {

using std::chrono::milliseconds;

// No handshake message comes near this; a peer that has not authenticated yet cannot make
// us buffer more (FrameReader holds at most two frames).
constexpr std::size_t kMaxHandshakeBytes = 256;
// The ADDRESS frame, read only from a peer that has proved it holds the token.
constexpr std::size_t kMaxAddressFrameBytes = handshake::kAddressHeaderBytes +
                                              handshake::kMaxWorkerAddressBytes +
                                              handshake::kAddressTagBytes;
// Pause between connection attempts while nobody listens yet.
constexpr milliseconds kRetryPause{20};
// A missed wakeup in accept() costs at most this.
constexpr milliseconds kMaxSleep{50};

// The per-source limit's key: the peer's host, without its port.
std::string host_of(const sockaddr* a) {
  const std::string s = format_address(a);
  auto split = split_host_port(s);
  return split.ok() ? split->host : s;
}

}  // namespace

// One peer between accept(2) and its endpoint.
struct Handshake {
  enum class Stage { kHello, kProof, kConfirm, kAddress };
  ScopedFd fd;
  std::string peer;    // "peer 10.0.0.2:40123"
  std::string source;  // "10.0.0.2": the per-source limit counts these
  Clock::time_point deadline;
  Stage stage = Stage::kHello;
  FrameReader in;
  handshake::Transcript transcript;  // from HELLO on
  SharedSecret shared{};             // the ephemeral X25519 secret, from HELLO to CONFIRM
  std::uint32_t remote_bulk = 0;
  std::uint32_t local_bulk = 0;     // ours once allocated, until open_channel takes it
  std::optional<SessionKeys> keys;  // from CONFIRM on
  ~Handshake() { wipe(shared); }
};

struct Listener::State {
  State(std::shared_ptr<Context> c, Token t, ListenerOptions o)
      : ctx(std::move(c)), token(std::move(t)), options(o) {}
  ~State() {
    for (auto& [fd, h] : handshakes) {
      if (h->local_bulk != 0) ctx->release_bulk_id(h->local_bulk);
    }
  }
  std::shared_ptr<Context> ctx;
  Token token;
  ListenerOptions options;
  ScopedFd socket;
  ScopedFd epoll;
  std::string address;
  std::map<int, std::unique_ptr<Handshake>> handshakes;
  std::map<std::string, std::size_t> per_source;
  log::Limiter refusals;  // a flood of refused peers writes a few lines a second, not millions
  // Authenticated, endpoint made, UCX still wiring it up; each with its deadline.
  std::deque<std::pair<Channel, Clock::time_point>> wiring;
  std::deque<Channel> ready;
  void check_wiring();

  void drop(int fd, const Status& why);
  void take_connections();
  void step(int fd);
  Status advance(Handshake& h, std::vector<std::byte> message, bool* finished);
  void expire();
  Status send(Handshake& h, std::span<const std::byte> message);
};

void Listener::State::drop(int fd, const Status& why) {
  auto it = handshakes.find(fd);
  if (it == handshakes.end()) return;
  Handshake& h = *it->second;
  if (!why.ok()) {
    log::warn_limited(refusals, "net: " + why.message());
    if (options.on_refused) options.on_refused(why);
  }
  if (h.local_bulk != 0) ctx->release_bulk_id(h.local_bulk);
  if (--per_source[h.source] == 0) per_source.erase(h.source);
  (void)::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
  handshakes.erase(it);  // closes the socket
}

void Listener::State::take_connections() {
  while (true) {
    sockaddr_storage ss{};
    socklen_t length = sizeof(ss);
    ScopedFd fd(::accept4(socket.get(), reinterpret_cast<sockaddr*>(&ss), &length,
                          SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        log::warn("net: {}: cannot accept a connection: {} (too many open files)", address,
                  std::strerror(errno));
      }
      return;  // EAGAIN: none left
    }
    const auto* a = reinterpret_cast<const sockaddr*>(&ss);
    const std::string peer = "peer " + format_address(a);
    const std::string source = host_of(a);
    if (per_source[source] >= options.max_handshakes_per_source) {
      log::warn_limited(refusals, fmt::format("net: {} refused: {} handshakes in progress already "
                                              "from {}",
                                              peer, per_source[source], source));
      continue;  // closed
    }
    if (handshakes.size() >= options.max_handshakes) {
      // The table is full: the oldest unproven handshake makes room, so that many sources
      // together cannot keep a legitimate peer out for longer than one handshake (a real one
      // finishes in milliseconds; only silent or slow peers grow old).
      auto oldest = std::min_element(handshakes.begin(), handshakes.end(), [](auto& x, auto& y) {
        return x.second->deadline < y.second->deadline;
      });
      drop(oldest->first,
           resource_exhausted(fmt::format("{} dropped: {} handshakes in progress on {}, it was "
                                          "the oldest unproven one and {} came",
                                          oldest->second->peer, handshakes.size(), address, peer)));
    }
    set_nodelay(fd.get());
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd.get();
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0) {
      log::warn("net: {}: epoll_ctl: {}", peer, std::strerror(errno));
      continue;
    }
    auto h = std::make_unique<Handshake>();
    h->peer = peer;
    h->source = source;
    h->deadline = Clock::now() + options.handshake_timeout;
    ++per_source[source];
    const int key = fd.get();
    h->fd = std::move(fd);
    handshakes.emplace(key, std::move(h));
  }
}

Status Listener::State::send(Handshake& h, std::span<const std::byte> message) {
  // A fresh socket's buffer takes every handshake message whole; one that does not is
  // treated as a failed peer rather than blocking the other handshakes.
  return send_all(h.fd.get(), frame(message), Clock::now(), h.peer);
}

void Listener::State::step(int fd) {
  auto it = handshakes.find(fd);
  if (it == handshakes.end()) return;
  Handshake& h = *it->second;
  const std::size_t limit =
      h.stage == Handshake::Stage::kAddress ? kMaxAddressFrameBytes : kMaxHandshakeBytes;
  bool closed = false;
  Status s = h.in.fill(fd, limit, h.peer, &closed);
  while (s.ok()) {
    const std::size_t max =
        h.stage == Handshake::Stage::kAddress ? kMaxAddressFrameBytes : kMaxHandshakeBytes;
    auto m = h.in.next(max, h.peer);
    if (!m.ok()) {
      s = m.status();
      break;
    }
    if (!m->has_value()) break;
    bool finished = false;
    s = advance(h, std::move(**m), &finished);
    if (finished) {
      // The socket has done its job: the channel lives on UCX from here.
      drop(fd, ok_status());
      return;
    }
  }
  if (s.ok() && closed) {
    s = aborted(fmt::format("{} closed the connection during the handshake", h.peer));
  }
  if (!s.ok()) drop(fd, s);
}

Status Listener::State::advance(Handshake& h, std::vector<std::byte> m, bool* finished) {
  switch (h.stage) {
    case Handshake::Stage::kHello: {
      auto hello = handshake::decode_hello(m, h.peer);
      if (!hello.ok()) return hello.status();
      handshake::Challenge challenge;
      if (!hello->has_token) {
        challenge.status = handshake::kNoToken;
        (void)send(h, handshake::encode(challenge));
        return unauthenticated(fmt::format(
            "{} failed authentication: it has no token (set FERRY_TOKEN or FERRY_TOKEN_FILE "
            "there)",
            h.peer));
      }
      FERRY_RETURN_IF_ERROR(random_bytes(challenge.nonce));
      // An ephemeral key for this handshake only: its private half is gone once the shared
      // secret is computed, so a token learned later does not open this session.
      FERRY_ASSIGN_OR_RETURN(const EphemeralKey ours, EphemeralKey::generate());
      FERRY_ASSIGN_OR_RETURN(h.shared, ours.agree(hello->key, h.peer));
      challenge.key = ours.public_key();
      h.transcript = {hello->nonce, challenge.nonce, hello->key, challenge.key};
      h.stage = Handshake::Stage::kProof;
      return send(h, handshake::encode(challenge));
    }
    case Handshake::Stage::kProof: {
      auto proof = handshake::decode_proof(m, h.peer);
      if (!proof.ok()) return proof.status();
      handshake::Verdict verdict;
      if (!macs_equal(proof->mac, handshake::connector_proof(token, h.transcript))) {
        verdict.status = handshake::kWrongToken;
        (void)send(h, handshake::encode(verdict));
        return unauthenticated(fmt::format("{} failed authentication: wrong token", h.peer));
      }
      if (proof->bulk_id == 0) {
        return corruption(fmt::format("{} sent a PROOF without a bulk id", h.peer));
      }
      verdict.mac = handshake::listener_proof(token, h.transcript);
      h.remote_bulk = proof->bulk_id;
      h.local_bulk = ctx->allocate_bulk_id();
      verdict.bulk_id = h.local_bulk;
      h.stage = Handshake::Stage::kConfirm;
      return send(h, handshake::encode(verdict));
    }
    case Handshake::Stage::kConfirm: {
      auto confirm = handshake::decode_confirm(m, h.peer);
      if (!confirm.ok()) return confirm.status();
      if (confirm->status != handshake::kOk) {
        return unauthenticated(fmt::format(
            "{} failed authentication: it rejected our proof, so it holds a different token",
            h.peer));
      }
      auto keys = derive_session_keys(token, h.transcript, h.shared, /*is_connector=*/false);
      wipe(h.shared);
      if (!keys.ok()) return keys.status();
      h.keys = std::move(*keys);
      h.stage = Handshake::Stage::kAddress;
      return ok_status();
    }
    case Handshake::Stage::kAddress: {
      // Verified (tag, then shape) before any byte of it reaches UCX. Ours goes out only
      // after: a connector whose ADDRESS we refuse never learns where to make an endpoint,
      // so it cannot start a UCX wireup that we would then have to tear down (UCX 1.13
      // aborts the process when a peer vanishes mid-wireup: docs/transport-net.md).
      auto remote = open_address(m, h.keys->address_receive, ctx->worker_address(), h.peer);
      if (!remote.ok()) return remote.status();
      auto sealed = seal_address(ctx->worker_address(), h.keys->address_send);
      if (!sealed.ok()) return sealed.status();
      FERRY_RETURN_IF_ERROR(send(h, *sealed));
      const std::uint32_t local = h.local_bulk;
      h.local_bulk = 0;  // open_channel owns it now
      // The handshake's fd closes when it is dropped; a dup stays with the channel.
      auto ch = open_channel(ctx, nullptr, ScopedFd(::fcntl(h.fd.get(), F_DUPFD_CLOEXEC, 0)),
                             h.peer, *remote, local, h.remote_bulk, *h.keys, h.in.take_rest());
      if (!ch.ok()) return ch.status();
      wiring.emplace_back(std::move(*ch), h.deadline);
      *finished = true;
      return ok_status();
    }
  }
  return internal_error("unreachable handshake stage");
}

void Listener::State::check_wiring() {
  const auto now = Clock::now();
  for (auto it = wiring.begin(); it != wiring.end();) {
    auto done = it->first.wired_up();
    if (done.ok() && *done) {
      ready.push_back(std::move(it->first));
    } else if (!done.ok() || now >= it->second) {
      const Status why =
          done.ok()
              ? timeout_error(fmt::format("{} authenticated but UCX could not connect to it "
                                          "within {} ms",
                                          it->first.peer(), options.handshake_timeout.count()))
              : done.status();
      log::warn("net: {}", why.message());
      if (options.on_refused) options.on_refused(why);
      it->first.abort();
    } else {
      ++it;
      continue;
    }
    it = wiring.erase(it);
  }
}

void Listener::State::expire() {
  const auto now = Clock::now();
  std::vector<int> late;
  for (const auto& [fd, h] : handshakes) {
    if (now >= h->deadline) late.push_back(fd);
  }
  for (int fd : late) {
    drop(fd, timeout_error(
                 fmt::format("{} connected to {} but did not finish the handshake within {} ms",
                             handshakes[fd]->peer, address, options.handshake_timeout.count())));
  }
}

Listener::Listener() = default;
Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;

const std::string& Listener::address() const { return state_->address; }
int Listener::fd() const { return state_->epoll.get(); }
std::size_t Listener::handshakes() const { return state_->handshakes.size(); }

Result<Listener> Listener::bind(std::shared_ptr<Context> context, const std::string& address,
                                Token token, ListenerOptions options) {
  auto addr = resolve(address, true);
  if (!addr.ok()) return addr.status();
  auto state = std::make_unique<State>(std::move(context), std::move(token), options);
  auto socket = listen_tcp(*addr, address);
  if (!socket.ok()) return socket.status();
  state->socket = std::move(*socket);
  state->epoll = ScopedFd(::epoll_create1(EPOLL_CLOEXEC));
  if (state->epoll.get() < 0) {
    return io_error(
        fmt::format("cannot listen on {}: epoll_create1: {}", address, std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = state->socket.get();
  if (::epoll_ctl(state->epoll.get(), EPOLL_CTL_ADD, state->socket.get(), &ev) != 0) {
    return io_error(
        fmt::format("cannot listen on {}: epoll_ctl: {}", address, std::strerror(errno)));
  }
  state->address = local_address(state->socket.get());
  log::info("net: listening on {} (token from {})", state->address, state->token.source());
  Listener l;
  l.state_ = std::move(state);
  return l;
}

Result<Channel> Listener::accept(milliseconds timeout) {
  State& s = *state_;
  const bool forever = timeout.count() < 0;
  const auto deadline = Clock::now() + (forever ? milliseconds(0) : timeout);
  while (true) {
    s.ctx->progress();
    if (!s.ready.empty()) break;
    // Sleep until the earliest of: our deadline, a handshake's deadline, kMaxSleep.
    auto until = forever ? Clock::now() + kMaxSleep : std::min(deadline, Clock::now() + kMaxSleep);
    for (const auto& [fd, h] : s.handshakes) until = std::min(until, h->deadline);
    // Endpoints being wired up progress through UCX, which this epoll does not see.
    if (!s.wiring.empty()) until = std::min(until, Clock::now() + milliseconds(1));
    const auto wait = std::max<long long>(
        0, std::chrono::duration_cast<milliseconds>(until - Clock::now()).count());
    epoll_event events[64];
    const int n = ::epoll_wait(s.epoll.get(), events, 64, static_cast<int>(wait));
    if (n < 0 && errno != EINTR) {
      return io_error(
          fmt::format("listener on {}: epoll_wait: {}", s.address, std::strerror(errno)));
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == s.socket.get()) {
        s.take_connections();
      } else {
        s.step(events[i].data.fd);
      }
    }
    s.expire();
    s.ctx->progress();
    s.check_wiring();
    if (!s.ready.empty()) break;
    if (!forever && Clock::now() >= deadline) {
      return timeout_error(
          fmt::format("no peer connected to {} within {} ms", s.address, timeout.count()));
    }
  }
  Channel ch = std::move(s.ready.front());
  s.ready.pop_front();
  return ch;
}

// ---- connect ----

namespace {

// One TCP connection attempt; kAborted while the address refuses connections.
Result<ScopedFd> dial(const SocketAddress& a, Clock::time_point deadline, const std::string& peer) {
  ScopedFd fd(::socket(a.get()->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return io_error(fmt::format("socket for {}: {}", peer, std::strerror(errno)));
  int err = 0;
  if (::connect(fd.get(), a.get(), a.length) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      const auto left = std::max<long long>(
          0, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) {
        return timeout_error(fmt::format("{} did not accept the connection in time", peer));
      }
      socklen_t length = sizeof(err);
      (void)::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &length);
    }
  }
  if (err == ECONNREFUSED || err == ECONNRESET) {
    // kAborted: retried by connect() like a listener that closed us before answering.
    return aborted(fmt::format("{}: {}", peer, std::strerror(err)));
  }
  if (err != 0) return io_error(fmt::format("cannot connect to {}: {}", peer, std::strerror(err)));
  set_nodelay(fd.get());
  return fd;
}

}  // namespace

Result<Channel> connect(std::shared_ptr<Context> context, const std::string& address,
                        const std::optional<Token>& token, milliseconds timeout,
                        const ConnectOptions& options) {
  auto addr = resolve(address, false);
  if (!addr.ok()) return addr.status();
  const std::string peer = fmt::format("{} at {}", options.role, address);
  const auto deadline = Clock::now() + (timeout.count() < 0 ? milliseconds(1LL << 40) : timeout);
  Status last_failure;
  const auto refuse = [&](Status why) {
    log::error("net: {}", why.message());
    return why;
  };
  const auto unreachable = [&]() {
    return timeout_error(
        fmt::format("could not connect to {} within {} ms: {} (is a listener running there?)", peer,
                    timeout.count(), last_failure.message()));
  };
  while (true) {
    auto fd = dial(*addr, deadline, peer);
    Result<std::vector<std::byte>> m =
        fd.ok() ? Result<std::vector<std::byte>>(std::vector<std::byte>{})
                : Result<std::vector<std::byte>>(fd.status());
    FrameReader in;
    handshake::Hello hello;
    // This attempt's ephemeral key; freed (with its private half) when connect() returns.
    FERRY_ASSIGN_OR_RETURN(const EphemeralKey ephemeral, EphemeralKey::generate());
    if (fd.ok()) {
      hello.has_token = token.has_value();
      hello.key = ephemeral.public_key();
      FERRY_RETURN_IF_ERROR(random_bytes(hello.nonce));
      Status st = send_all(fd->get(), frame(handshake::encode(hello)), deadline, peer);
      m = st.ok() ? read_frame(fd->get(), in, kMaxHandshakeBytes, deadline, peer)
                  : Result<std::vector<std::byte>>(st);
    }
    if (!m.ok()) {
      const Code code = m.status().code();
      if (code == Code::kAborted) {
        // Nobody listens there (yet), or the listener closed us before answering (full, or
        // going away): try again until the deadline.
        last_failure = m.status();
        if (Clock::now() < deadline) {
          const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
          std::this_thread::sleep_for(std::min(kRetryPause, left));
          continue;
        }
        return unreachable();
      }
      if (code == Code::kTimeout && !last_failure.ok()) return unreachable();
      if (code == Code::kTimeout) {
        return timeout_error(
            fmt::format("{} accepted the connection but did not answer the handshake within {} ms",
                        peer, timeout.count()));
      }
      return m.status();
    }
    const int s = fd->get();
    auto challenge = handshake::decode_challenge(*m, peer);
    if (!challenge.ok()) return refuse(challenge.status());
    if (challenge->status == handshake::kNoToken || !token.has_value()) {
      return refuse(unauthenticated(fmt::format(
          "{} refused us: we have no session token (set FERRY_TOKEN, or FERRY_TOKEN_FILE to a "
          "file with mode 0600)",
          peer)));
    }
    if (challenge->status != handshake::kOk) {
      return refuse(
          corruption(fmt::format("{} sent a CHALLENGE with status {}", peer, challenge->status)));
    }
    const auto handshake_timeout = [&](const Status& st) {
      if (st.code() != Code::kTimeout) return st;
      return timeout_error(
          fmt::format("{} did not finish the handshake within {} ms", peer, timeout.count()));
    };
    auto shared = ephemeral.agree(challenge->key, peer);
    if (!shared.ok()) return refuse(shared.status());
    const ScopedWipe forget_shared(*shared);
    const handshake::Transcript transcript{hello.nonce, challenge->nonce, hello.key,
                                           challenge->key};
    handshake::Proof proof;
    proof.mac = handshake::connector_proof(*token, transcript);
    std::uint32_t local_bulk = context->allocate_bulk_id();
    proof.bulk_id = local_bulk;
    const auto give_up = [&](Status st) {
      if (local_bulk != 0) context->release_bulk_id(local_bulk);
      return st;
    };
    Status st = send_all(s, frame(handshake::encode(proof)), deadline, peer);
    if (!st.ok()) return give_up(handshake_timeout(st));
    m = read_frame(s, in, kMaxHandshakeBytes, deadline, peer);
    if (!m.ok()) return give_up(handshake_timeout(m.status()));
    auto verdict = handshake::decode_verdict(*m, peer);
    if (!verdict.ok()) return give_up(refuse(verdict.status()));
    if (verdict->status == handshake::kWrongToken) {
      return give_up(refuse(unauthenticated(fmt::format(
          "{} refused our token (the tokens differ: check FERRY_TOKEN / FERRY_TOKEN_FILE on both "
          "sides)",
          peer))));
    }
    if (verdict->status != handshake::kOk || verdict->bulk_id == 0) {
      return give_up(refuse(corruption(fmt::format("{} sent a malformed VERDICT", peer))));
    }
    handshake::Confirm confirm;
    if (!macs_equal(verdict->mac, handshake::listener_proof(*token, transcript))) {
      confirm.status = handshake::kBadProof;
      (void)send_all(s, frame(handshake::encode(confirm)), deadline, peer);
      return give_up(refuse(unauthenticated(fmt::format(
          "{} failed authentication: its proof does not match our token (a different token "
          "there, or not the peer meant)",
          peer))));
    }
    // The listener is authenticated: CONFIRM, then the address of a worker of this
    // channel's own (Context::add_worker says why), sealed; then read the listener's.
    auto worker = context->add_worker();
    if (!worker.ok()) return give_up(worker.status());
    auto keys = derive_session_keys(*token, transcript, *shared, /*is_connector=*/true);
    if (!keys.ok()) return give_up(keys.status());
    auto sealed = seal_address((*worker)->address(), keys->address_send);
    if (!sealed.ok()) return give_up(sealed.status());
    std::vector<std::byte> out = frame(handshake::encode(confirm));
    const auto address_frame = frame(*sealed);
    out.insert(out.end(), address_frame.begin(), address_frame.end());
    st = send_all(s, out, deadline, peer);
    if (!st.ok()) return give_up(handshake_timeout(st));
    m = read_frame(s, in, kMaxAddressFrameBytes, deadline, peer);
    if (!m.ok() && m.status().code() == Code::kAborted) {
      // The listener answers our ADDRESS with its own only once ours verified.
      return give_up(refuse(aborted(fmt::format(
          "{} closed the connection instead of sending its ADDRESS: it refused ours (changed "
          "on the way, or another session's; its log names the reason)",
          peer))));
    }
    if (!m.ok()) return give_up(handshake_timeout(m.status()));
    // Verified (tag, then shape) before any byte of it reaches UCX.
    auto remote = open_address(*m, keys->address_receive, (*worker)->address(), peer);
    if (!remote.ok()) return give_up(refuse(remote.status()));
    const std::uint32_t local = local_bulk;
    local_bulk = 0;  // open_channel owns it now
    auto ch = open_channel(context, std::move(*worker), std::move(*fd), peer, *remote, local,
                           verdict->bulk_id, *keys, in.take_rest());
    if (!ch.ok()) return ch.status();
    while (true) {  // until UCX has wired the endpoint up (the listener waits likewise)
      context->progress();
      auto done = ch->wired_up();
      if (!done.ok()) return done.status();
      if (*done) return ch;
      if (Clock::now() >= deadline) {
        ch->abort();
        return timeout_error(
            fmt::format("{} authenticated but UCX could not connect to it within {} ms", peer,
                        timeout.count()));
      }
      context->wait(milliseconds(1));
    }
  }
}

}  // namespace ferry::net

#include "transport/net/channel.h"

#include <fmt/format.h>
#include <ucp/api/ucp.h>

#include <cstring>
#include <thread>

#include "base/log.h"
#include "transport/net/address.h"
#include "wire/message.h"

namespace ferry::net {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t kFrameHeaderBytes = 4;
// No handshake message comes near this; a peer that has not authenticated yet cannot make
// us buffer more.
constexpr std::size_t kMaxHandshakeBytes = 256;
// How long close() waits for UCX to flush what was sent before it forces the endpoint shut.
constexpr milliseconds kCloseFlushTimeout{2000};
// How long close() waits for the peer to acknowledge our FIN (it does when it reads it).
constexpr milliseconds kFinTimeout{1000};
// A frame "length" that no message has: the sender closes the channel after its messages.
constexpr std::uint32_t kFinFrame = 0xffffffffu;
// Pause between connection attempts while nobody listens yet.
constexpr milliseconds kRetryPause{20};

struct Deadline {
  Clock::time_point at;
  bool forever = false;
  explicit Deadline(milliseconds timeout)
      : at(Clock::now() + (timeout.count() < 0 ? milliseconds(0) : timeout)),
        forever(timeout.count() < 0) {}
  bool passed() const { return !forever && Clock::now() >= at; }
  milliseconds left() const {
    if (forever) return milliseconds(50);
    const auto d = std::chrono::duration_cast<milliseconds>(at - Clock::now());
    return d.count() < 0 ? milliseconds(0) : d;
  }
};

std::uint64_t bulk_tag(std::uint32_t id, std::uint32_t key) {
  return (std::uint64_t{id} << 32) | key;
}

}  // namespace

std::size_t max_message_bytes() { return wire::kHeaderBytes + wire::kMaxBodyBytes; }

// What a Channel owns, shared with its Transfers so that they can tell a dead peer from a
// slow one. Its address is the UCX error handler's argument, so it never moves.
struct Endpoint {
  struct PendingSend {
    std::vector<std::byte> frame;
    void* request = nullptr;
  };

  std::shared_ptr<Context> ctx;
  ucp_ep_h ep = nullptr;
  std::string peer;
  bool failed = false;  // the channel can carry nothing more; `error` says why
  bool broken = false;  // UCX reported the endpoint dead: no flush, no FIN
  bool fin_sent = false;
  bool fin_received = false;
  Status error;
  std::vector<std::byte> inbox;
  std::size_t inbox_start = 0;
  std::deque<PendingSend> sends;
  std::uint32_t local_bulk = 0;   // bulk messages to us carry this id
  std::uint32_t remote_bulk = 0;  // ... and ours to the peer carry its id
  std::string transports = "unknown";
  // close() flushes what was sent first; false for a peer that never finished connecting,
  // which could not acknowledge a flush.
  bool linger = true;

  ~Endpoint() {
    close();
    if (local_bulk != 0) ctx->release_bulk_id(local_bulk);
  }

  void fail(Status s) {
    if (failed) return;
    failed = true;
    error = std::move(s);
    log::debug("net: {}", error.message());
  }

  void reap() {
    while (!sends.empty()) {
      void* r = sends.front().request;
      if (ucp_request_check_status(r) == UCS_INPROGRESS) return;
      ucp_request_free(r);
      sends.pop_front();
    }
  }

  // Moves whatever the stream holds into the inbox.
  void pull() {
    if (ep == nullptr) return;
    while (true) {
      std::size_t length = 0;
      ucs_status_ptr_t data = ucp_stream_recv_data_nb(ep, &length);
      if (data == nullptr) return;
      if (UCS_PTR_IS_ERR(data)) {
        broken = true;
        fail(aborted(fmt::format("{} is gone: {}", peer, ucs_status_string(UCS_PTR_STATUS(data)))));
        return;
      }
      const auto* bytes = static_cast<const std::byte*>(data);
      inbox.insert(inbox.end(), bytes, bytes + length);
      ucp_stream_data_release(ep, data);
    }
  }

  // The next whole message, if one has arrived. Messages come before the error of a peer
  // that died after sending them.
  Result<std::optional<std::vector<std::byte>>> take(std::size_t max_bytes) {
    pull();
    const std::size_t have = inbox.size() - inbox_start;
    if (have >= kFrameHeaderBytes) {
      std::uint32_t length = 0;
      for (std::size_t i = 0; i < kFrameHeaderBytes; ++i) {
        length |= std::uint32_t{static_cast<std::uint8_t>(inbox[inbox_start + i])} << (8 * i);
      }
      if (length == kFinFrame) {
        // The peer closes after the messages before this one, all delivered already.
        inbox_start += kFrameHeaderBytes;
        fin_received = true;
        send_fin();
        fail(aborted(fmt::format("{} closed the connection", peer)));
        return error;
      }
      if (length > max_bytes) {
        fail(corruption(fmt::format("{} sent a message of {} bytes; the limit here is {}", peer,
                                    length, max_bytes)));
        return error;
      }
      if (have >= kFrameHeaderBytes + length) {
        const auto begin =
            inbox.begin() + static_cast<std::ptrdiff_t>(inbox_start + kFrameHeaderBytes);
        std::vector<std::byte> out(begin, begin + length);
        inbox_start += kFrameHeaderBytes + length;
        if (inbox_start == inbox.size()) {
          inbox.clear();
          inbox_start = 0;
        } else if (inbox_start > (1u << 20) && 2 * inbox_start > inbox.size()) {
          inbox.erase(inbox.begin(), inbox.begin() + static_cast<std::ptrdiff_t>(inbox_start));
          inbox_start = 0;
        }
        return std::optional<std::vector<std::byte>>(std::move(out));
      }
    }
    if (failed) return error;
    return std::optional<std::vector<std::byte>>();
  }

  Result<std::vector<std::byte>> receive(const Deadline& deadline, std::size_t max_bytes) {
    while (true) {
      ctx->progress();
      auto m = take(max_bytes);
      if (!m.ok()) return m.status();
      if (m->has_value()) return std::move(**m);
      if (deadline.passed()) return timeout_error("");
      ctx->wait(deadline.left());
    }
  }

  Status send(std::span<const std::byte> message, const Deadline& deadline) {
    if (failed) return error;
    if (message.size() > max_message_bytes()) {
      return invalid_argument(fmt::format("a message of {} bytes for {} exceeds the limit of {}",
                                          message.size(), peer, max_message_bytes()));
    }
    reap();
    PendingSend ps;
    ps.frame.resize(kFrameHeaderBytes + message.size());
    const auto length = static_cast<std::uint32_t>(message.size());
    for (std::size_t i = 0; i < kFrameHeaderBytes; ++i) {
      ps.frame[i] = static_cast<std::byte>(length >> (8 * i));
    }
    if (!message.empty()) {
      std::memcpy(ps.frame.data() + kFrameHeaderBytes, message.data(), message.size());
    }
    ucp_request_param_t param{};
    void* r = ucp_stream_send_nbx(ep, ps.frame.data(), ps.frame.size(), &param);
    if (r == nullptr) return ok_status();
    if (UCS_PTR_IS_ERR(r)) {
      broken = true;
      fail(aborted(fmt::format("{} is gone: {}", peer, ucs_status_string(UCS_PTR_STATUS(r)))));
      return error;
    }
    ps.request = r;
    sends.push_back(std::move(ps));  // the frame's heap buffer stays where UCX reads it
    while (true) {
      const ucs_status_t st = ucp_request_check_status(r);
      if (st != UCS_INPROGRESS) {
        reap();
        if (st == UCS_OK) return ok_status();
        broken = true;
        fail(aborted(fmt::format("{} is gone: {}", peer, ucs_status_string(st))));
        return error;
      }
      if (failed) return error;
      if (deadline.passed()) {
        return timeout_error(fmt::format("{} did not take our message in time", peer));
      }
      ctx->wait(deadline.left());
      ctx->progress();
    }
  }

  // Waits (progressing) up to `timeout` for request `r`; frees it either way.
  void settle(ucs_status_ptr_t r, milliseconds timeout) {
    if (!UCS_PTR_IS_PTR(r)) return;
    const auto deadline = Clock::now() + timeout;
    while (true) {
      ctx->progress();
      if (ucp_request_check_status(r) != UCS_INPROGRESS || Clock::now() >= deadline) break;
      ctx->wait(milliseconds(10));
    }
    ucp_request_free(r);  // if still in flight, UCX frees it when it completes
  }

  // Queues a FIN frame (nonblocking): "nothing follows; acknowledge with yours".
  void send_fin() {
    if (fin_sent || broken || ep == nullptr) return;
    fin_sent = true;
    PendingSend ps;
    ps.frame.assign(kFrameHeaderBytes, std::byte{0xff});
    ucp_request_param_t param{};
    void* r = ucp_stream_send_nbx(ep, ps.frame.data(), ps.frame.size(), &param);
    if (UCS_PTR_IS_PTR(r)) {
      ps.request = r;
      sends.push_back(std::move(ps));
    }
  }

  void close() {
    if (ep == nullptr) return;
    // UCX does not order a disconnect after data still in flight to the peer, so a plain
    // close can lose our last messages. Instead: FIN after them, and wait (bounded) for the
    // peer's FIN, which it sends once it has read everything before ours. A peer that is
    // not reading costs kFinTimeout.
    if (!broken && linger && !fin_received) {
      send_fin();
      const auto deadline = Clock::now() + kFinTimeout;
      while (!fin_received && !broken && Clock::now() < deadline) {
        ctx->progress();
        while (true) {  // discard what the caller never read, looking for the FIN
          auto m = take(max_message_bytes());
          if (!m.ok() || !m->has_value()) break;
        }
        if (fin_received || broken) break;
        ctx->wait(milliseconds(10));
      }
    }
    if (!broken && linger && !sends.empty()) {
      ucp_request_param_t flush{};
      settle(ucp_ep_flush_nbx(ep, &flush), kCloseFlushTimeout);
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
    ep = nullptr;
    settle(r, kCloseFlushTimeout);
    for (auto& s : sends) {
      if (ucp_request_check_status(s.request) == UCS_INPROGRESS) {
        // UCX may still read the frame: leave it to UCX rather than free memory it uses.
        new std::vector<std::byte>(std::move(s.frame));
      }
      ucp_request_free(s.request);
    }
    sends.clear();
    if (!failed) {
      failed = true;
      error = failed_precondition(fmt::format("the channel to {} is closed", peer));
    }
  }
};

namespace {

void on_endpoint_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* e = static_cast<Endpoint*>(arg);
  e->broken = true;
  e->fail(aborted(fmt::format(
      "{} is gone: {} (its process exited or was killed, or the network between us failed)",
      e->peer, ucs_status_string(status))));
}

Result<std::shared_ptr<Endpoint>> open_endpoint(const std::shared_ptr<Context>& ctx,
                                                std::string peer, const SocketAddress* address,
                                                ucp_conn_request_h request) {
  auto e = std::make_shared<Endpoint>();
  e->ctx = ctx;
  e->peer = std::move(peer);
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  // PEER mode: a dead or unreachable peer calls on_endpoint_error instead of hanging.
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = on_endpoint_error;
  p.err_handler.arg = e.get();
  if (address != nullptr) {
    p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = address->get();
    p.sockaddr.addrlen = address->length;
  } else {
    p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    p.conn_request = request;
  }
  const ucs_status_t st = ucp_ep_create(ctx->worker(), &p, &e->ep);
  if (st != UCS_OK) {
    e->ep = nullptr;
    return io_error(
        fmt::format("UCX ucp_ep_create for {} failed: {}", e->peer, ucs_status_string(st)));
  }
  return e;
}

bool has_rdma(const std::string& transports) {
  for (const char* tl : {"rc", "dc", "ud", "ib"}) {
    // Entries look like "rc_mlx5/mlx5_0:1" or " ud_verbs/...": match a tl name's start.
    for (std::size_t at = transports.find(tl); at != std::string::npos;
         at = transports.find(tl, at + 1)) {
      if (at == 0 || transports[at - 1] == ' ') return true;
    }
  }
  return false;
}

// Logs what UCX chose, and warns when it fell back to TCP on a node that has RDMA: the
// complaint users of NIXL and Dynamo have, that it does so silently.
void note_transports(Endpoint& e) {
  e.transports = endpoint_transports(e.ep);
  log::info("net: {} authenticated; UCX transports: {}", e.peer, e.transports);
  if (has_rdma(e.ctx->resources()) && !has_rdma(e.transports)) {
    log::warn(
        "net: {} runs over {} although this node has RDMA transports ({}); the peer may lack "
        "them or be unreachable through them. Force a choice with UCX_TLS / UCX_NET_DEVICES "
        "(docs/transport-net.md)",
        e.peer, e.transports, e.ctx->resources());
  }
}

}  // namespace

// ---- Transfer ----

Transfer::Transfer(Transfer&& o) noexcept
    : endpoint_(std::move(o.endpoint_)),
      request_(o.request_),
      receive_(o.receive_),
      finished_(o.finished_),
      cancelled_(o.cancelled_),
      key_(o.key_),
      expected_(o.expected_),
      bytes_(o.bytes_),
      status_(std::move(o.status_)) {
  o.request_ = nullptr;
}

Transfer& Transfer::operator=(Transfer&& o) noexcept {
  if (this != &o) {
    release();
    endpoint_ = std::move(o.endpoint_);
    request_ = o.request_;
    receive_ = o.receive_;
    finished_ = o.finished_;
    cancelled_ = o.cancelled_;
    key_ = o.key_;
    expected_ = o.expected_;
    bytes_ = o.bytes_;
    status_ = std::move(o.status_);
    o.request_ = nullptr;
  }
  return *this;
}

Transfer::~Transfer() { release(); }

void Transfer::release() {
  if (request_ == nullptr) return;
  Context& ctx = *endpoint_->ctx;
  if (receive_ && !cancelled_) ucp_request_cancel(ctx.worker(), request_);
  const auto deadline = Clock::now() + kCloseFlushTimeout;
  while (ucp_request_check_status(request_) == UCS_INPROGRESS && Clock::now() < deadline) {
    ctx.progress();
    if (ucp_request_check_status(request_) != UCS_INPROGRESS) break;
    ctx.wait(milliseconds(10));
  }
  ucp_request_free(request_);  // if still in flight, UCX frees it when it completes
  request_ = nullptr;
}

bool Transfer::done() {
  if (finished_ || request_ == nullptr) return true;
  ucs_status_t st;
  std::size_t length = expected_;
  if (receive_) {
    ucp_tag_recv_info_t info{};
    st = ucp_tag_recv_request_test(request_, &info);
    if (st != UCS_INPROGRESS) length = info.length;
  } else {
    st = ucp_request_check_status(request_);
  }
  if (st == UCS_INPROGRESS) {
    // A posted receive is not tied to the endpoint, so UCX would wait for it forever.
    if (endpoint_->failed && receive_ && !cancelled_) {
      ucp_request_cancel(endpoint_->ctx->worker(), request_);
      cancelled_ = true;
    }
    return false;
  }
  finish(st, length);
  return true;
}

void Transfer::finish(ucs_status_t st, std::size_t length) {
  ucp_request_free(request_);
  request_ = nullptr;
  finished_ = true;
  const char* dir = receive_ ? "from" : "to";
  if (st == UCS_OK) {
    bytes_ = length;
    status_ = ok_status();
  } else if (st == UCS_ERR_MESSAGE_TRUNCATED) {
    status_ =
        corruption(fmt::format("{} sent bulk message {} larger than the {} bytes posted for it",
                               endpoint_->peer, key_, expected_));
  } else if (endpoint_->failed) {
    status_ = endpoint_->error;
  } else {
    status_ = aborted(fmt::format("bulk message {} {} {} failed: {}", key_, dir, endpoint_->peer,
                                  ucs_status_string(st)));
  }
}

// ---- Channel ----

Channel::~Channel() = default;

Status Channel::send(std::span<const std::byte> message, milliseconds timeout) {
  if (!endpoint_) return failed_precondition("send on a closed net channel");
  Status s = endpoint_->send(message, Deadline(timeout));
  if (s.code() == Code::kTimeout) {
    return timeout_error(
        fmt::format("{} did not take our message within {} ms", peer(), timeout.count()));
  }
  return s;
}

std::size_t Channel::sends_in_flight() const {
  if (!endpoint_) return 0;
  endpoint_->reap();
  return endpoint_->sends.size();
}

Result<std::optional<std::vector<std::byte>>> Channel::try_receive() {
  if (!endpoint_) return failed_precondition("receive on a closed net channel");
  return endpoint_->take(max_message_bytes());
}

Result<std::vector<std::byte>> Channel::receive(milliseconds timeout) {
  if (!endpoint_) return failed_precondition("receive on a closed net channel");
  auto m = endpoint_->receive(Deadline(timeout), max_message_bytes());
  if (!m.ok() && m.status().code() == Code::kTimeout) {
    return timeout_error(fmt::format("no message from {} within {} ms", peer(), timeout.count()));
  }
  return m;
}

Result<Transfer> Channel::send_bulk(std::uint32_t key, std::span<const std::byte> data,
                                    const MemoryRegion& region) {
  if (!endpoint_) return failed_precondition("send_bulk on a closed net channel");
  Endpoint& e = *endpoint_;
  if (!data.empty() && !region.contains(data.data(), data.size())) {
    return invalid_argument(
        fmt::format("bulk message {} for {}: its {} bytes are not inside the registered region",
                    key, e.peer, data.size()));
  }
  if (e.failed) return e.error;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
  p.memh = region.handle();
  void* r = ucp_tag_send_nbx(e.ep, data.data(), data.size(), bulk_tag(e.remote_bulk, key), &p);
  Transfer t;
  t.endpoint_ = endpoint_;
  t.key_ = key;
  t.expected_ = data.size();
  if (r == nullptr) {
    t.finished_ = true;
    t.bytes_ = data.size();
    return t;
  }
  if (UCS_PTR_IS_ERR(r)) {
    e.broken = true;
    e.fail(aborted(fmt::format("{} is gone: {}", e.peer, ucs_status_string(UCS_PTR_STATUS(r)))));
    return e.error;
  }
  t.request_ = r;
  return t;
}

Result<Transfer> Channel::receive_bulk(std::uint32_t key, std::span<std::byte> into,
                                       const MemoryRegion& region) {
  if (!endpoint_) return failed_precondition("receive_bulk on a closed net channel");
  Endpoint& e = *endpoint_;
  if (!into.empty() && !region.contains(into.data(), into.size())) {
    return invalid_argument(fmt::format(
        "bulk message {} from {}: the {}-byte buffer is not inside the registered region", key,
        e.peer, into.size()));
  }
  if (e.failed) return e.error;
  ucp_request_param_t p{};
  // Always a request, even when the data is already here, so done() reads its length.
  p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.memh = region.handle();
  void* r = ucp_tag_recv_nbx(e.ctx->worker(), into.data(), into.size(), bulk_tag(e.local_bulk, key),
                             ~std::uint64_t{0}, &p);
  if (UCS_PTR_IS_ERR(r)) {
    return io_error(fmt::format("UCX ucp_tag_recv_nbx for bulk message {} from {} failed: {}", key,
                                e.peer, ucs_status_string(UCS_PTR_STATUS(r))));
  }
  Transfer t;
  t.endpoint_ = endpoint_;
  t.receive_ = true;
  t.key_ = key;
  t.expected_ = into.size();
  t.request_ = r;
  return t;
}

Status Channel::wait(Transfer& t, milliseconds timeout) {
  const Deadline deadline(timeout);
  while (true) {
    context().progress();
    if (t.done()) return t.status();
    if (deadline.passed()) {
      return timeout_error(fmt::format("bulk message {} {} {} did not complete within {} ms",
                                       t.key(), t.receive_ ? "from" : "to", peer(),
                                       timeout.count()));
    }
    context().wait(deadline.left());
  }
}

Status Channel::health() const {
  if (!endpoint_) return failed_precondition("the net channel is closed");
  return endpoint_->failed ? endpoint_->error : ok_status();
}

void Channel::close() {
  if (endpoint_) endpoint_->close();
  endpoint_.reset();
}

void Channel::abort() {
  if (endpoint_) {
    endpoint_->linger = false;
    endpoint_->close();
  }
  endpoint_.reset();
}

int Channel::fd() const { return endpoint_ ? endpoint_->ctx->event_fd() : -1; }
Context& Channel::context() const { return *endpoint_->ctx; }
const std::string& Channel::peer() const { return endpoint_->peer; }
const std::string& Channel::transports() const { return endpoint_->transports; }

// ---- Listener ----

struct Listener::State {
  State(std::shared_ptr<Context> c, Token t, ListenerOptions o)
      : ctx(std::move(c)), token(std::move(t)), options(o) {}
  ~State() {
    for (ucp_conn_request_h r : pending) ucp_listener_reject(listener, r);
    if (listener != nullptr) ucp_listener_destroy(listener);
  }
  std::shared_ptr<Context> ctx;
  Token token;
  ListenerOptions options;
  ucp_listener_h listener = nullptr;
  std::deque<ucp_conn_request_h> pending;
  std::string address;
};

namespace {

void on_conn_request(ucp_conn_request_h request, void* arg) {
  static_cast<Listener::State*>(arg)->pending.push_back(request);
}

}  // namespace

Listener::Listener() = default;
Listener::Listener(Listener&&) noexcept = default;
Listener& Listener::operator=(Listener&&) noexcept = default;
Listener::~Listener() = default;

const std::string& Listener::address() const { return state_->address; }
int Listener::fd() const { return state_->ctx->event_fd(); }

Result<Listener> Listener::bind(std::shared_ptr<Context> context, const std::string& address,
                                Token token, ListenerOptions options) {
  auto addr = resolve(address, true);
  if (!addr.ok()) return addr.status();
  auto state = std::make_unique<State>(std::move(context), std::move(token), options);
  ucp_listener_params_t p{};
  p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  p.sockaddr.addr = addr->get();
  p.sockaddr.addrlen = addr->length;
  p.conn_handler.cb = on_conn_request;
  p.conn_handler.arg = state.get();
  const ucs_status_t st = ucp_listener_create(state->ctx->worker(), &p, &state->listener);
  if (st != UCS_OK) {
    state->listener = nullptr;
    return io_error(fmt::format("cannot listen on {}: {}{}", address, ucs_status_string(st),
                                st == UCS_ERR_BUSY ? " (the port is in use)" : ""));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucp_listener_query(state->listener, &attr) == UCS_OK) {
    state->address = format_address(reinterpret_cast<const sockaddr*>(&attr.sockaddr));
  } else {
    state->address = address;
  }
  log::info("net: listening on {} (token from {})", state->address, state->token.source());
  Listener l;
  l.state_ = std::move(state);
  return l;
}

Result<Channel> Listener::accept(milliseconds timeout) {
  State& s = *state_;
  const Deadline deadline(timeout);
  while (true) {
    s.ctx->progress();
    if (!s.pending.empty()) break;
    if (deadline.passed()) {
      return timeout_error(
          fmt::format("no peer connected to {} within {} ms", s.address, timeout.count()));
    }
    s.ctx->wait(deadline.left());
  }
  ucp_conn_request_h request = s.pending.front();
  s.pending.pop_front();
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string peer = "peer ?";
  if (ucp_conn_request_query(request, &attr) == UCS_OK) {
    peer = "peer " + format_address(reinterpret_cast<const sockaddr*>(&attr.client_address));
  }
  auto opened = open_endpoint(s.ctx, peer, nullptr, request);
  if (!opened.ok()) {
    ucp_listener_reject(s.listener, request);
    return opened.status();
  }
  std::shared_ptr<Endpoint> e = std::move(*opened);

  // The handshake: nothing else is read from or sent to this peer until it ends well.
  const Deadline hs(s.options.handshake_timeout);
  const auto refuse = [&](Status why) {
    log::warn("net: {}", why.message());
    return why;
  };
  const auto silent = [&](const Status& st) {
    if (st.code() != Code::kTimeout) return st;
    e->linger = false;
    return timeout_error(
        fmt::format("{} connected to {} but did not finish the handshake within {} ms", peer,
                    s.address, s.options.handshake_timeout.count()));
  };
  auto m = e->receive(hs, kMaxHandshakeBytes);
  if (!m.ok()) return refuse(silent(m.status()));
  auto hello = handshake::decode_hello(*m, peer);
  if (!hello.ok()) return refuse(hello.status());
  handshake::Challenge challenge;
  if (!hello->has_token) {
    challenge.status = handshake::kNoToken;
    (void)e->send(handshake::encode(challenge), hs);
    return refuse(unauthenticated(fmt::format(
        "{} failed authentication: it has no token (set FERRY_TOKEN or FERRY_TOKEN_FILE there)",
        peer)));
  }
  Status st = random_bytes(challenge.nonce);
  if (!st.ok()) return st;
  st = e->send(handshake::encode(challenge), hs);
  if (!st.ok()) return refuse(silent(st));
  m = e->receive(hs, kMaxHandshakeBytes);
  if (!m.ok()) return refuse(silent(m.status()));
  auto proof = handshake::decode_proof(*m, peer);
  if (!proof.ok()) return refuse(proof.status());
  handshake::Verdict verdict;
  const Mac expected = handshake::connector_proof(s.token, hello->nonce, challenge.nonce);
  if (!macs_equal(proof->mac, expected)) {
    verdict.status = handshake::kWrongToken;
    (void)e->send(handshake::encode(verdict), hs);
    return refuse(unauthenticated(fmt::format("{} failed authentication: wrong token", peer)));
  }
  if (proof->bulk_id == 0) {
    return refuse(corruption(fmt::format("{} sent a PROOF without a bulk id", peer)));
  }
  verdict.mac = handshake::listener_proof(s.token, hello->nonce, challenge.nonce);
  e->remote_bulk = proof->bulk_id;
  e->local_bulk = s.ctx->allocate_bulk_id();
  verdict.bulk_id = e->local_bulk;
  st = e->send(handshake::encode(verdict), hs);
  if (!st.ok()) return refuse(silent(st));
  m = e->receive(hs, kMaxHandshakeBytes);
  if (!m.ok()) return refuse(silent(m.status()));
  auto confirm = handshake::decode_confirm(*m, peer);
  if (!confirm.ok()) return refuse(confirm.status());
  if (confirm->status != handshake::kOk) {
    return refuse(unauthenticated(fmt::format(
        "{} failed authentication: it rejected our proof, so it holds a different token", peer)));
  }
  note_transports(*e);
  return Channel(std::move(e));
}

// ---- connect ----

Result<Channel> connect(std::shared_ptr<Context> context, const std::string& address,
                        const std::optional<Token>& token, milliseconds timeout,
                        const ConnectOptions& options) {
  auto addr = resolve(address, false);
  if (!addr.ok()) return addr.status();
  const std::string peer = fmt::format("{} at {}", options.role, address);
  const Deadline deadline(timeout);
  Status last_failure;
  const auto refuse = [&](Status why) {
    log::error("net: {}", why.message());
    return why;
  };
  while (true) {
    auto opened = open_endpoint(context, peer, &*addr, nullptr);
    if (!opened.ok()) return opened.status();
    std::shared_ptr<Endpoint> e = std::move(*opened);
    handshake::Hello hello;
    hello.has_token = token.has_value();
    Status st = random_bytes(hello.nonce);
    if (!st.ok()) return st;
    st = e->send(handshake::encode(hello), deadline);
    Result<std::vector<std::byte>> m =
        st.ok() ? e->receive(deadline, kMaxHandshakeBytes) : Result<std::vector<std::byte>>(st);
    if (!m.ok()) {
      e->linger = false;
      if (m.status().code() == Code::kAborted) {
        // Nobody listens there (yet), or the listener went away before it answered.
        last_failure = m.status();
        e.reset();
        if (!deadline.passed()) {
          std::this_thread::sleep_for(std::min(kRetryPause, deadline.left()));
          continue;
        }
        return timeout_error(
            fmt::format("could not connect to {} within {} ms: {} (is a listener running there?)",
                        peer, timeout.count(), last_failure.message()));
      }
      if (m.status().code() == Code::kTimeout && !last_failure.ok()) {
        // The deadline fell inside a retry; the refusals before it are the story.
        return timeout_error(
            fmt::format("could not connect to {} within {} ms: {} (is a listener running there?)",
                        peer, timeout.count(), last_failure.message()));
      }
      if (m.status().code() == Code::kTimeout) {
        return timeout_error(
            fmt::format("{} accepted the connection but did not answer the handshake within {} ms",
                        peer, timeout.count()));
      }
      return m.status();
    }
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
    handshake::Proof proof;
    proof.mac = handshake::connector_proof(*token, hello.nonce, challenge->nonce);
    e->local_bulk = context->allocate_bulk_id();
    proof.bulk_id = e->local_bulk;
    st = e->send(handshake::encode(proof), deadline);
    if (!st.ok()) return st;
    m = e->receive(deadline, kMaxHandshakeBytes);
    if (!m.ok()) {
      e->linger = false;
      if (m.status().code() == Code::kTimeout) {
        return timeout_error(
            fmt::format("{} did not finish the handshake within {} ms", peer, timeout.count()));
      }
      return m.status();
    }
    auto verdict = handshake::decode_verdict(*m, peer);
    if (!verdict.ok()) return refuse(verdict.status());
    if (verdict->status == handshake::kWrongToken) {
      return refuse(unauthenticated(fmt::format(
          "{} refused our token (the tokens differ: check FERRY_TOKEN / FERRY_TOKEN_FILE on both "
          "sides)",
          peer)));
    }
    if (verdict->status != handshake::kOk || verdict->bulk_id == 0) {
      return refuse(corruption(fmt::format("{} sent a malformed VERDICT", peer)));
    }
    handshake::Confirm confirm;
    if (!macs_equal(verdict->mac,
                    handshake::listener_proof(*token, hello.nonce, challenge->nonce))) {
      confirm.status = handshake::kBadProof;
      (void)e->send(handshake::encode(confirm), deadline);
      return refuse(unauthenticated(fmt::format(
          "{} failed authentication: its proof does not match our token (a different token "
          "there, or not the peer meant)",
          peer)));
    }
    st = e->send(handshake::encode(confirm), deadline);
    if (!st.ok()) return st;
    e->remote_bulk = verdict->bulk_id;
    note_transports(*e);
    return Channel(std::move(e));
  }
}

}  // namespace ferry::net

#include "transport/net/channel.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <cerrno>

#include <cstring>

#include "base/log.h"
#include "wire/message.h"

namespace ferry::net {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::size_t kFrameHeaderBytes = 4;
// How long close() waits for UCX to flush what was sent before it forces the endpoint shut.
constexpr milliseconds kCloseFlushTimeout{2000};
// How long close() waits for the peer to acknowledge our FIN (it does when it reads it).
constexpr milliseconds kFinTimeout{1000};
// A frame "length" that no message has: the sender closes the channel after its messages.
constexpr std::uint32_t kFinFrame = 0xffffffffu;

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
  std::shared_ptr<Worker> own_worker;  // connect()'s channels: destroyed after the endpoint
  ucp_worker_h worker = nullptr;       // the worker the endpoint lives on
  // The peer's bootstrap socket. Its end (EOF, reset) is how we learn that the peer died:
  // UCX reports a dead peer of a worker-address endpoint on whichever endpoint of ours it
  // paired with the peer's, which is not always this one.
  ScopedFd bootstrap;
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
  void* wireup = nullptr;  // the flush wired_up() waits on
  bool wired = false;
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

  // Fails the channel when the peer's bootstrap socket has ended. Nothing is sent on it after
  // the handshake, so a byte there is a protocol error.
  void check_bootstrap() {
    if (failed || !bootstrap.valid()) return;
    char byte = 0;
    const ssize_t n = ::recv(bootstrap.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    broken = true;
    if (n > 0) {
      fail(corruption(fmt::format("{} sent bytes on its bootstrap socket after the handshake",
                                  peer)));
      return;
    }
    fail(aborted(fmt::format(
        "{} is gone: its connection closed (its process exited or was killed, or the network "
        "between us failed)",
        peer)));
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
    check_bootstrap();
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
      check_bootstrap();
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
    if (wireup != nullptr) {
      ucp_request_free(wireup);  // UCX completes it with the endpoint
      wireup = nullptr;
    }
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
  if (receive_ && !cancelled_) ucp_request_cancel(endpoint_->worker, request_);
  // A send to a peer that is gone (or cut off) would never complete: do not wait for it.
  const auto deadline = Clock::now() + (endpoint_->failed ? milliseconds(0) : kCloseFlushTimeout);
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
    endpoint_->check_bootstrap();
    // A posted receive is not tied to the endpoint, so UCX would wait for it forever.
    if (endpoint_->failed && receive_ && !cancelled_) {
      ucp_request_cancel(endpoint_->worker, request_);
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
  void* r = ucp_tag_recv_nbx(e.worker, into.data(), into.size(), bulk_tag(e.local_bulk, key),
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

Result<bool> Channel::wired_up() {
  if (!endpoint_) return failed_precondition("wired_up on a closed net channel");
  Endpoint& e = *endpoint_;
  if (e.failed) return e.error;
  if (e.wired) return true;
  if (e.wireup == nullptr) {
    ucp_request_param_t p{};
    ucs_status_ptr_t r = ucp_ep_flush_nbx(e.ep, &p);
    if (r == nullptr) return e.wired = true;
    if (UCS_PTR_IS_ERR(r)) {
      e.broken = true;
      e.fail(aborted(fmt::format("{} is gone: {}", e.peer, ucs_status_string(UCS_PTR_STATUS(r)))));
      return e.error;
    }
    e.wireup = r;
  }
  const ucs_status_t st = ucp_request_check_status(e.wireup);
  if (st == UCS_INPROGRESS) return false;
  ucp_request_free(e.wireup);
  e.wireup = nullptr;
  if (st != UCS_OK) {
    e.broken = true;
    e.fail(aborted(fmt::format("{} is gone: {}", e.peer, ucs_status_string(st))));
    return e.error;
  }
  return e.wired = true;
}

int Channel::fd() const { return endpoint_ ? endpoint_->ctx->event_fd() : -1; }
Context& Channel::context() const { return *endpoint_->ctx; }
const std::string& Channel::peer() const { return endpoint_->peer; }
const std::string& Channel::transports() const { return endpoint_->transports; }

// ---- made by Listener::accept and connect() (bootstrap.cc) ----

Result<Channel> open_channel(const std::shared_ptr<Context>& ctx, std::shared_ptr<Worker> worker,
                             ScopedFd bootstrap, std::string peer,
                             std::span<const std::byte> remote_worker, std::uint32_t local_bulk,
                             std::uint32_t remote_bulk) {
  auto e = std::make_shared<Endpoint>();
  e->ctx = ctx;
  e->bootstrap = std::move(bootstrap);
  if (e->bootstrap.valid()) ctx->watch_once(e->bootstrap.get());
  e->worker = worker ? worker->get() : ctx->worker();
  e->own_worker = std::move(worker);
  e->peer = std::move(peer);
  e->local_bulk = local_bulk;  // released with the endpoint, whatever happens next
  e->remote_bulk = remote_bulk;
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  // Both sides create their endpoint from the other's worker address; UCX pairs the two.
  p.address = reinterpret_cast<const ucp_address_t*>(remote_worker.data());
  // PEER mode: a dead or unreachable peer calls on_endpoint_error instead of hanging.
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = on_endpoint_error;
  p.err_handler.arg = e.get();
  const ucs_status_t st = ucp_ep_create(e->worker, &p, &e->ep);
  if (st != UCS_OK) {
    e->ep = nullptr;
    return io_error(
        fmt::format("UCX ucp_ep_create for {} failed: {}", e->peer, ucs_status_string(st)));
  }
  note_transports(*e);
  return Channel(std::move(e));
}

}  // namespace ferry::net

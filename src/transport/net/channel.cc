#include "transport/net/channel.h"

#include <fmt/format.h>
#include <ucp/api/ucp.h>

#include "base/status_macros.h"
#include "transport/net/endpoint.h"

namespace ferry::net {

testing::Tamper& control_tamper() {
  static testing::Tamper hook;
  return hook;
}
testing::Tamper& bulk_tamper() {
  static testing::Tamper hook;
  return hook;
}

namespace {

std::uint64_t bulk_tag(std::uint32_t id, std::uint32_t key) {
  return (std::uint64_t{id} << 32) | key;
}

}  // namespace

void testing::set_control_tamper(Tamper hook) { control_tamper() = std::move(hook); }
void testing::set_bulk_tamper(Tamper hook) { bulk_tamper() = std::move(hook); }

Status testing::send_frame(Channel& channel, std::uint8_t kind,
                           std::span<const std::byte> payload) {
  if (!channel.endpoint_) return failed_precondition("send_frame on a closed net channel");
  return channel.endpoint_->post(static_cast<FrameKind>(kind), payload).status();
}

std::size_t max_message_bytes() { return transport::kMaxMessageBytes; }

LiveEndpoints& live_endpoints() {
  static auto* live = new LiveEndpoints();  // never destroyed: UCX may report at exit
  return *live;
}

namespace {

void on_endpoint_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  live_endpoints().with(reinterpret_cast<std::uintptr_t>(arg), [&](Endpoint& e) {
    e.broken = true;
    e.fail(aborted(fmt::format(
        "{} is gone: {} (its process exited or was killed, or the network between us failed)",
        e.peer, ucs_status_string(status))));
  });
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
      op_(std::move(o.op_)),
      request_(o.request_),
      receive_(o.receive_),
      finished_(o.finished_),
      cancelled_(o.cancelled_),
      arrived_(o.arrived_),
      key_(o.key_),
      expected_(o.expected_),
      bytes_(o.bytes_),
      into_(o.into_),
      staging_(std::move(o.staging_)),
      status_(std::move(o.status_)) {
  o.request_ = nullptr;
}

Transfer& Transfer::operator=(Transfer&& o) noexcept {
  if (this != &o) {
    release();
    endpoint_ = std::move(o.endpoint_);
    op_ = std::move(o.op_);
    request_ = o.request_;
    receive_ = o.receive_;
    finished_ = o.finished_;
    cancelled_ = o.cancelled_;
    arrived_ = o.arrived_;
    key_ = o.key_;
    expected_ = o.expected_;
    bytes_ = o.bytes_;
    into_ = o.into_;
    staging_ = std::move(o.staging_);
    status_ = std::move(o.status_);
    o.request_ = nullptr;
  }
  return *this;
}

Transfer::~Transfer() { release(); }

void Transfer::release() {
  if (op_) {
    endpoint_->tcp_abandon(op_);
    op_.reset();
    return;
  }
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
  if (ucp_request_check_status(request_) == UCS_INPROGRESS && !staging_.empty()) {
    // UCX may still read the ciphertext: keep it until the endpoint is closed.
    endpoint_->abandoned_staging.push_back(std::move(staging_));
  }
  ucp_request_free(request_);  // if still in flight, UCX frees it when it completes
  request_ = nullptr;
}

bool Transfer::done() {
  if (finished_) return true;
  if (op_) {
    if (!endpoint_->tcp_progress(*op_)) return false;
    finished_ = true;
    status_ = op_->status;
    bytes_ = op_->bytes;
    op_.reset();
    return true;
  }
  if (request_ != nullptr) {
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
    ucp_request_free(request_);
    request_ = nullptr;
    if (!receive_ || st != UCS_OK) {
      finish(st, length);
      return true;
    }
    bytes_ = length;
    arrived_ = true;
  }
  if (!arrived_) return true;  // moved from
  // The bytes are here; they count once checked as the sender announced them. The
  // announcement left before the bytes, but on another path: it may still be on its way.
  auto a = endpoint_->take_announcement(key_);
  if (!a) {
    endpoint_->check_bootstrap();
    if (!endpoint_->failed) return false;
    finished_ = true;
    status_ = endpoint_->error;
    return true;
  }
  finished_ = true;
  status_ = endpoint_->check_bulk(*a, key_, std::span<std::byte>(into_, bytes_));
  return true;
}

void Transfer::finish(ucs_status_t st, std::size_t length) {
  finished_ = true;
  endpoint_->give_back_staging(std::move(staging_));
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
  if (endpoint_->tcp) return endpoint_->outgoing.size();
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
  Transfer t;
  t.endpoint_ = endpoint_;
  t.key_ = key;
  t.expected_ = data.size();
  // Announce first: its tag covers the bytes as they leave (the ciphertext, under kEncrypt).
  const std::uint64_t counter = e.bulk_sent++;
  Tag tag{};
  std::span<const std::byte> out = data;
  if (e.bulk_protect == WireProtect::kMac) {
    Status s = aead_seal(e.keys.bulk_send, counter, data, {}, {}, &tag);
    if (!s.ok()) return s;
  } else if (e.bulk_protect == WireProtect::kEncrypt) {
    // Never in place: `data` is the ring, which local receivers read too.
    t.staging_ = e.take_staging(data.size());
    const std::span<std::byte> cipher(t.staging_.data(), data.size());
    Status s = aead_seal(e.keys.bulk_send, counter, {}, data, cipher, &tag);
    if (!s.ok()) return s;
    out = cipher;
  }
  std::vector<std::byte> announcement;
  announcement.reserve(kAnnounceBytes);
  coding::put_u32(&announcement, key);
  coding::put_u8(&announcement, static_cast<std::uint8_t>(e.bulk_protect));
  coding::put_u64(&announcement, data.size());
  const auto* tp = reinterpret_cast<const std::byte*>(tag.data());
  announcement.insert(announcement.end(), tp, tp + kTagBytes);
  e.reap();
  auto posted = e.post(FrameKind::kAnnounce, announcement);
  if (!posted.ok()) return posted.status();
  if (e.tcp) {
    auto op = std::make_shared<TcpOp>();
    op->key = key;
    op->staging = std::move(t.staging_);
    op->data = out.data() == data.data()
                   ? data
                   : std::span<const std::byte>(op->staging).first(out.size());
    t.op_ = op;
    e.tcp_send_bulk(std::move(op));
    return t;
  }
  ucp_request_param_t p{};
  if (out.data() == data.data()) {
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
    p.memh = region.handle();
  }
  void* r = ucp_tag_send_nbx(e.ep, out.data(), out.size(), bulk_tag(e.remote_bulk, key), &p);
  if (r == nullptr) {
    t.finished_ = true;
    t.bytes_ = data.size();
    e.give_back_staging(std::move(t.staging_));
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
  Transfer t;
  t.endpoint_ = endpoint_;
  t.receive_ = true;
  t.key_ = key;
  t.expected_ = into.size();
  t.into_ = into.data();
  if (e.tcp) {
    auto op = std::make_shared<TcpOp>();
    op->receive = true;
    op->key = key;
    op->into = into.data();
    op->capacity = into.size();
    FERRY_RETURN_IF_ERROR(e.tcp_receive_bulk(op));
    t.op_ = std::move(op);
    return t;
  }
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
  t.request_ = r;
  return t;
}

Status Channel::wait(Transfer& t, milliseconds timeout) {
  // A peer that ended the session (an ERROR, then it closed) sends no more bulk, and a posted
  // receive does not complete when its endpoint fails: its end is looked for every
  // kPeerCheck, so the caller reads the ERROR now instead of a timeout later.
  const Deadline deadline(timeout);
  while (true) {
    context().progress();
    if (t.done()) return t.status();
    if (t.receive_ && endpoint_) {
      endpoint_->check_bootstrap();
      if (endpoint_->failed) return endpoint_->error;
    }
    if (deadline.passed()) {
      return timeout_error(fmt::format("bulk message {} {} {} did not complete within {} ms",
                                       t.key(), t.receive_ ? "from" : "to", peer(),
                                       timeout.count()));
    }
    context().wait(t.receive_ ? std::min(deadline.left(), kPeerCheck) : deadline.left());
  }
}

void Channel::set_bulk_protection(WireProtect send, WireProtect minimum_received) {
  if (!endpoint_) return;
  endpoint_->bulk_protect = send;
  endpoint_->bulk_minimum = minimum_received;
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
  if (e.wired || e.tcp) return true;
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
                             const VerifiedWorkerAddress& remote_worker, std::uint32_t local_bulk,
                             std::uint32_t remote_bulk, const SessionKeys& keys,
                             std::vector<std::byte> early) {
  auto e = std::make_shared<Endpoint>();
  e->keys = keys;
  e->ctx = ctx;
  e->bootstrap = std::move(bootstrap);
  if (e->bootstrap.valid() && ctx->path() == NetPath::kUcx) ctx->watch_once(e->bootstrap.get());
  e->worker = worker ? worker->get() : ctx->worker();
  e->own_worker = std::move(worker);
  e->peer = std::move(peer);
  e->local_bulk = local_bulk;  // released with the endpoint, whatever happens next
  e->remote_bulk = remote_bulk;
  if (ctx->path() == NetPath::kTcp) {
    FERRY_RETURN_IF_ERROR(e->tcp_open(std::move(early)));
    log::info("net: {} authenticated; bulk over ferry's TCP path", e->peer);
    return Channel(std::move(e));
  }
  if (!early.empty()) {
    return corruption(
        fmt::format("{} sent bytes on its bootstrap socket after the handshake", e->peer));
  }
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  // Both sides create their endpoint from the other's worker address; UCX pairs the two.
  p.address = reinterpret_cast<const ucp_address_t*>(remote_worker.bytes().data());
  // PEER mode: a dead or unreachable peer calls on_endpoint_error instead of hanging.
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = on_endpoint_error;
  e->ticket = live_endpoints().add(e.get());
  p.err_handler.arg = reinterpret_cast<void*>(static_cast<std::uintptr_t>(e->ticket));
  const ucs_status_t st = ucp_ep_create(e->worker, &p, &e->ep);
  if (st != UCS_OK) {
    live_endpoints().remove(e->ticket);
    e->ep = nullptr;
    return io_error(
        fmt::format("UCX ucp_ep_create for {} failed: {}", e->peer, ucs_status_string(st)));
  }
  note_transports(*e);
  // Bytes are taken from UCX as they arrive: those it still holds when it handles the
  // peer's end are dropped, and they may be the peer's last message (its ACK).
  e->puller = ctx->add_after_turn([endpoint = e.get()] { endpoint->pull(); });
  return Channel(std::move(e));
}

}  // namespace ferry::net

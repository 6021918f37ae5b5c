#include "transport/net/channel.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "base/clock.h"
#include "base/coding.h"
#include "base/log.h"
#include "transport/net/testing.h"
#include "transport/transport.h"

namespace ferry::net {
namespace {

using std::chrono::milliseconds;

// A frame: u32 length, then that many bytes: AES-256-GCM of (payload, kind), then its tag.
// The kind byte is last so that the payload is decrypted straight into its own buffer.
// The length is the GCM's additional data; the nonce is the count of frames before it in
// that direction, never sent (docs/transport-net.md).
constexpr std::size_t kFrameHeaderBytes = 4;
constexpr std::size_t kFrameOverhead = 1 + kTagBytes;
// The largest frame: a message of transport::kMaxMessageBytes.
constexpr std::size_t kMaxFrameBytes =
    kFrameHeaderBytes + transport::kMaxMessageBytes + kFrameOverhead;
// How long close() waits for UCX to flush what was sent before it forces the endpoint shut.
constexpr milliseconds kCloseFlushTimeout{2000};
// How long close() waits for the peer to acknowledge our FIN (it does when it reads it).
constexpr milliseconds kFinTimeout{1000};
// What a frame carries. Values travel on the wire: never renumber.
enum class FrameKind : std::uint8_t {
  kMessage = 0,   // a control message for the channel's user
  kFin = 1,       // nothing follows; acknowledge with yours (close())
  kAnnounce = 2,  // the next bulk message's key, size, protection and tag
};
// An announcement's payload: u32 key, u8 WireProtect, u64 bytes, the tag.
constexpr std::size_t kAnnounceBytes = 4 + 1 + 8 + kTagBytes;
// Announcements held for receives not yet complete; more is a misbehaving peer.
constexpr std::size_t kMaxAnnouncements = 1u << 16;
// Messages a peer may have sent that this end opened and has not taken yet. A session has at
// most a BEGIN (<= 64 MiB) and the small messages of its ring's slots in flight; a peer past
// these is flooding the channel, which fails naming it instead of growing.
constexpr std::size_t kMaxUnreadBytes = 3 * transport::kMaxMessageBytes;
constexpr std::size_t kMaxUnreadMessages = 1u << 20;
// UCX does not always fail an endpoint whose peer went away (nor wake its worker's fd), so a
// wait looks at the peer's bootstrap socket at least this often.
constexpr milliseconds kPeerCheck{100};

testing::Tamper& control_tamper() {
  static testing::Tamper hook;
  return hook;
}
testing::Tamper& bulk_tamper() {
  static testing::Tamper hook;
  return hook;
}

std::uint64_t bulk_tag(std::uint32_t id, std::uint32_t key) {
  return (std::uint64_t{id} << 32) | key;
}

}  // namespace

void testing::set_control_tamper(Tamper hook) { control_tamper() = std::move(hook); }
void testing::set_bulk_tamper(Tamper hook) { bulk_tamper() = std::move(hook); }

std::size_t max_message_bytes() { return transport::kMaxMessageBytes; }

struct Endpoint;

// The UCX error handler's argument is a ticket, looked up here, not the Endpoint's address:
// a close whose request outlives settle() leaves the UCX endpoint behind its freed Endpoint,
// and a late report of its peer's end must find nothing rather than freed memory.
class LiveEndpoints {
 public:
  std::uint64_t add(Endpoint* e) {
    std::lock_guard<std::mutex> l(mu_);
    const std::uint64_t ticket = ++last_;
    live_[ticket] = e;
    return ticket;
  }
  void remove(std::uint64_t ticket) {
    std::lock_guard<std::mutex> l(mu_);
    live_.erase(ticket);
  }
  // Runs `f` on the endpoint if it is still open; holds the lock so that it stays so.
  template <typename F>
  void with(std::uint64_t ticket, F f) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = live_.find(ticket);
    if (it != live_.end()) f(*it->second);
  }

 private:
  std::mutex mu_;
  std::uint64_t last_ = 0;
  std::unordered_map<std::uint64_t, Endpoint*> live_;
};

LiveEndpoints& live_endpoints() {
  static auto* live = new LiveEndpoints();  // never destroyed: UCX may report at exit
  return *live;
}

// What a Channel owns, shared with its Transfers so that they can tell a dead peer from a
// slow one.
struct Endpoint {
  struct PendingSend {
    std::vector<std::byte> frame;
    void* request = nullptr;
  };
  // What the sender said of a bulk message it was about to send.
  struct Announcement {
    std::uint64_t counter = 0;  // its nonce: the count of announcements before it
    WireProtect protect = WireProtect::kNone;
    std::uint64_t bytes = 0;
    Tag tag{};
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
  // No more frames are opened: a FIN, or a frame that failed its checks. A peer's end alone
  // does not set it: the frames it sent before are still opened and delivered.
  bool inbox_closed = false;
  bool fin_sent = false;
  bool fin_received = false;
  std::uint64_t ticket = 0;  // in live_endpoints() while the UCX endpoint is ours
  std::uint64_t puller = 0;  // ctx's after-turn hook that pulls the stream (0: none)
  Status error;
  std::vector<std::byte> inbox;
  std::size_t inbox_start = 0;
  std::deque<std::vector<std::byte>> ready;  // opened messages, not yet taken
  std::size_t ready_bytes = 0;
  std::deque<PendingSend> sends;
  SessionKeys keys;
  std::uint64_t frames_sent = 0;  // the control nonces, one count per direction
  std::uint64_t frames_received = 0;
  std::uint64_t bulk_sent = 0;  // the bulk nonces
  std::uint64_t bulk_announced = 0;
  std::map<std::uint32_t, std::deque<Announcement>> announced;  // by key
  std::size_t announcements = 0;
  WireProtect bulk_protect = WireProtect::kNone;
  WireProtect bulk_minimum = WireProtect::kNone;
  // kEncrypt's ciphertext buffers, kept for the next sends: a fresh one per bucket costs
  // more in page faults than the encryption itself.
  std::vector<std::vector<std::byte>> staging_pool;
  static constexpr std::size_t kMaxPooledStaging = 8;
  // Ciphertext of sends released while UCX may still read it: freed with the Endpoint, after
  // close() has force-closed the endpoint (and so ended those sends).
  std::vector<std::vector<std::byte>> abandoned_staging;

  std::vector<std::byte> take_staging(std::size_t bytes) {
    std::vector<std::byte> b;
    if (!staging_pool.empty()) {
      b = std::move(staging_pool.back());
      staging_pool.pop_back();
    }
    if (b.size() < bytes) b.resize(bytes);
    return b;
  }
  void give_back_staging(std::vector<std::byte> b) {
    if (!b.empty() && staging_pool.size() < kMaxPooledStaging) staging_pool.push_back(std::move(b));
  }
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

  // A frame the peer sent ends the inbox (a FIN, or one that failed its checks).
  void reject(Status s) {
    inbox_closed = true;
    fail(std::move(s));
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
      fail(corruption(
          fmt::format("{} sent bytes on its bootstrap socket after the handshake", peer)));
      return;
    }
    fail(aborted(fmt::format(
        "{} is gone: its connection closed (its process exited or was killed, or the network "
        "between us failed)",
        peer)));
  }

  // Moves what the stream holds into the inbox while less than a whole frame of it is
  // undecoded: what arrives faster than this end reads (a file streamed to a slow disk) stays
  // in UCX's buffers instead of being copied into ours as well.
  void pull() {
    if (ep == nullptr) return;
    while (inbox_closed || inbox.size() - inbox_start < kMaxFrameBytes) {
      std::size_t length = 0;
      ucs_status_ptr_t data = ucp_stream_recv_data_nb(ep, &length);
      if (data == nullptr) return;
      if (UCS_PTR_IS_ERR(data)) {
        broken = true;
        fail(aborted(fmt::format("{} is gone: {}", peer, ucs_status_string(UCS_PTR_STATUS(data)))));
        return;
      }
      const auto* bytes = static_cast<const std::byte*>(data);
      // After a FIN, a bad frame or a flood nothing more is believed: dropped unread.
      if (!inbox_closed) inbox.insert(inbox.end(), bytes, bytes + length);
      ucp_stream_data_release(ep, data);
    }
  }

  // Messages opened while the caller waits for a bulk message are held until taken; a peer
  // that sends more of them than any session has in flight is flooding the channel.
  bool unread_limit_passed() {
    if (ready_bytes <= kMaxUnreadBytes && ready.size() <= kMaxUnreadMessages) return false;
    reject(resource_exhausted(fmt::format(
        "{} sent {} bytes in {} messages that this end has not read (the limits are {} bytes "
        "and {} messages): a peer flooding the channel",
        peer, ready_bytes, ready.size(), kMaxUnreadBytes, kMaxUnreadMessages)));
    ready.clear();
    ready_bytes = 0;
    return true;
  }

  // Opens the whole frames that arrived, in order: messages join `ready`, announcements
  // `announced`; a FIN or a frame that fails authentication fails the channel. Stops at the
  // first message unless `all` (a bulk receive looking for its announcement), so that a
  // FIN behind a message is seen when the message has been taken, as it was sent.
  void pump(bool all) {
    pull();
    while (!inbox_closed && (!failed || broken) && (all || ready.empty())) {
      const std::size_t have = inbox.size() - inbox_start;
      if (have < kFrameHeaderBytes) return;
      std::byte* frame = inbox.data() + inbox_start;
      const std::uint32_t length =
          coding::Reader(std::span<const std::byte>(frame, kFrameHeaderBytes)).u32();
      if (length < kFrameOverhead || length > max_message_bytes() + kFrameOverhead) {
        reject(corruption(fmt::format("{} sent a frame of {} bytes; the limit here is {}", peer,
                                      length, max_message_bytes() + kFrameOverhead)));
        return;
      }
      if (have < kFrameHeaderBytes + length) return;
      const std::span<std::byte> body(frame + kFrameHeaderBytes, length);
      if (control_tamper()) control_tamper()(body);
      Tag tag{};
      std::memcpy(tag.data(), body.data() + length - kTagBytes, kTagBytes);
      std::vector<std::byte> payload(length - kTagBytes);
      if (!aead_open(keys.control_receive, frames_received++,
                     std::span<const std::byte>(frame, kFrameHeaderBytes),
                     body.first(length - kTagBytes), payload, tag)) {
        reject(corruption(
            fmt::format("a message from {} failed authentication: it was tampered with on the way, "
                        "replayed, reordered or dropped, or is not from the peer",
                        peer)));
        return;
      }
      const auto kind = static_cast<FrameKind>(payload.back());
      payload.pop_back();
      inbox_start += kFrameHeaderBytes + length;
      if (inbox_start == inbox.size()) {
        inbox.clear();
        inbox_start = 0;
      } else if (inbox_start > (1u << 20) && 2 * inbox_start > inbox.size()) {
        inbox.erase(inbox.begin(), inbox.begin() + static_cast<std::ptrdiff_t>(inbox_start));
        inbox_start = 0;
      }
      switch (kind) {
        case FrameKind::kMessage:
          ready_bytes += payload.size();
          ready.push_back(std::move(payload));
          if (unread_limit_passed()) return;
          break;
        case FrameKind::kFin:
          // The peer closes after the messages before this one (in `ready`).
          fin_received = true;
          send_fin();
          reject(aborted(fmt::format("{} closed the connection", peer)));
          return;
        case FrameKind::kAnnounce:
          announce(payload);
          break;
        default:
          reject(corruption(
              fmt::format("{} sent a frame of unknown kind {}", peer, static_cast<int>(kind))));
          return;
      }
    }
  }

  void announce(std::span<const std::byte> payload) {
    coding::Reader r(payload);
    const std::uint32_t key = r.u32();
    Announcement a;
    const std::uint8_t protect = r.u8();
    a.bytes = r.u64();
    const std::string tag = r.bytes(kTagBytes);
    if (!r.ok() || r.remaining() != 0 ||
        protect > static_cast<std::uint8_t>(WireProtect::kEncrypt)) {
      reject(corruption(fmt::format("{} sent a malformed bulk announcement", peer)));
      return;
    }
    if (announcements >= kMaxAnnouncements) {
      reject(corruption(fmt::format("{} announced more than {} bulk messages nobody received", peer,
                                    kMaxAnnouncements)));
      return;
    }
    a.protect = static_cast<WireProtect>(protect);
    a.counter = bulk_announced++;
    std::memcpy(a.tag.data(), tag.data(), kTagBytes);
    announced[key].push_back(a);
    ++announcements;
  }

  // The sender's announcement of bulk message `key`, if it has arrived.
  std::optional<Announcement> take_announcement(std::uint32_t key) {
    pump(/*all=*/true);
    auto it = announced.find(key);
    if (it == announced.end()) return std::nullopt;
    Announcement a = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) announced.erase(it);
    --announcements;
    return a;
  }

  // Checks (and decrypts, in place) bulk message `key`'s bytes as `a` announced them.
  Status check_bulk(const Announcement& a, std::uint32_t key, std::span<std::byte> data) {
    if (a.bytes != data.size()) {
      return corruption(fmt::format("{} announced {} bytes for bulk message {} and sent {}", peer,
                                    a.bytes, key, data.size()));
    }
    if (a.protect < bulk_minimum) {
      return failed_precondition(fmt::format(
          "{} sends bulk bytes with wire protection '{}'; this end requires at least '{}' "
          "(--wire-protect, SyncOptions::wire_protect)",
          peer, wire_protect_name(a.protect), wire_protect_name(bulk_minimum)));
    }
    if (bulk_tamper()) bulk_tamper()(data);
    bool authentic = true;
    if (a.protect == WireProtect::kMac) {
      authentic = aead_open(keys.bulk_receive, a.counter, data, {}, {}, a.tag);
    } else if (a.protect == WireProtect::kEncrypt) {
      authentic = aead_open(keys.bulk_receive, a.counter, {}, data, data, a.tag);
    }
    if (!authentic) {
      return corruption(fmt::format(
          "bulk message {} from {} failed authentication ({}): its bytes were tampered with "
          "on the way or are not from the peer",
          key, peer, wire_protect_name(a.protect)));
    }
    return ok_status();
  }

  // Seals (kind, payload) into a frame and hands it to UCX without waiting. Returns the
  // request still in flight (kept in `sends`), or nullptr when UCX took the frame at once.
  Result<void*> post(FrameKind kind, std::span<const std::byte> payload) {
    PendingSend ps;
    const auto length = static_cast<std::uint32_t>(payload.size() + kFrameOverhead);
    ps.frame.reserve(kFrameHeaderBytes + length);
    coding::put_u32(&ps.frame, length);  // kFrameHeaderBytes
    ps.frame.resize(kFrameHeaderBytes + length);
    if (!payload.empty()) {
      std::memcpy(ps.frame.data() + kFrameHeaderBytes, payload.data(), payload.size());
    }
    ps.frame[kFrameHeaderBytes + payload.size()] = static_cast<std::byte>(kind);
    const std::span<std::byte> plain(ps.frame.data() + kFrameHeaderBytes, 1 + payload.size());
    Tag tag{};
    Status s = aead_seal(keys.control_send, frames_sent++,
                         std::span<const std::byte>(ps.frame.data(), kFrameHeaderBytes), plain,
                         plain, &tag);
    if (!s.ok()) return s;
    std::memcpy(ps.frame.data() + kFrameHeaderBytes + 1 + payload.size(), tag.data(), kTagBytes);
    ucp_request_param_t param{};
    void* r = ucp_stream_send_nbx(ep, ps.frame.data(), ps.frame.size(), &param);
    if (r == nullptr) return r;
    if (UCS_PTR_IS_ERR(r)) {
      broken = true;
      fail(aborted(fmt::format("{} is gone: {}", peer, ucs_status_string(UCS_PTR_STATUS(r)))));
      return error;
    }
    ps.request = r;
    sends.push_back(std::move(ps));  // the frame's heap buffer stays where UCX reads it
    return r;
  }

  // The next whole message, if one has arrived. Messages come before the error of a peer
  // that died after sending them.
  Result<std::optional<std::vector<std::byte>>> take(std::size_t /*max_bytes*/) {
    pump(/*all=*/false);
    if (ready.empty() && !failed) {
      check_bootstrap();
      // The bootstrap socket may report the peer's end before UCX has handed over what the
      // peer sent just before it (its last message): take that first.
      if (failed) {
        ctx->progress();
        pump(/*all=*/false);
      }
    }
    if (!ready.empty()) {
      std::vector<std::byte> out = std::move(ready.front());
      ready.pop_front();
      ready_bytes -= out.size();
      return std::optional<std::vector<std::byte>>(std::move(out));
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
      ctx->wait(std::min(deadline.left(), kPeerCheck));
    }
  }

  Status send(std::span<const std::byte> message, const Deadline& deadline) {
    if (message.size() > max_message_bytes()) {
      return invalid_argument(fmt::format("a message of {} bytes for {} exceeds the limit of {}",
                                          message.size(), peer, max_message_bytes()));
    }
    if (failed) return error;
    reap();
    auto posted = post(FrameKind::kMessage, message);
    if (!posted.ok()) return posted.status();
    void* r = *posted;
    if (r == nullptr) return ok_status();
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
      ctx->wait(std::min(deadline.left(), kPeerCheck));
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
    (void)post(FrameKind::kFin, {});
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
    // Forced: UCX must stop reading our buffers (the ring) now. UCX 1.13's TCP transport can
    // crash the process when the peer ends after its endpoint was closed (forced or not)
    // with data still queued for it; callers that drop a live peer (the replicate server)
    // keep its endpoint open until it ends or takes what was queued.
    live_endpoints().remove(ticket);
    ctx->remove_after_turn(puller);
    puller = 0;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
    ep = nullptr;
    settle(r, kCloseFlushTimeout);
    for (auto& s : sends) {
      if (ucp_request_check_status(s.request) == UCS_INPROGRESS) {
        // UCX may still read the frame: the context keeps it until the request completes.
        ctx->drain(worker, s.request, std::move(s.frame));
        continue;
      }
      ucp_request_free(s.request);
    }
    sends.clear();
    // The peer learns at once that this end is gone (its check_bootstrap), even while
    // Transfers keep this Endpoint alive.
    bootstrap.reset();
    if (!failed) {
      failed = true;
      error = failed_precondition(fmt::format("the channel to {} is closed", peer));
    }
  }
};

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
  t.into_ = into.data();
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
                             const VerifiedWorkerAddress& remote_worker, std::uint32_t local_bulk,
                             std::uint32_t remote_bulk, const SessionKeys& keys) {
  auto e = std::make_shared<Endpoint>();
  e->keys = keys;
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

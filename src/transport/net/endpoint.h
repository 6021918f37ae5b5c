// Internal to the net transport: what a Channel owns (Endpoint), shared with its Transfers,
// and the frames both of its paths use. channel.cc holds the control frames and UCX's bulk
// path; tcp_stream.cc ferry's own TCP path, where the bootstrap socket carries everything.
#pragma once

#include <fmt/format.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "base/coding.h"
#include "base/log.h"
#include "transport/net/channel.h"
#include "transport/net/testing.h"
#include "transport/transport.h"

namespace ferry::net {

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
  // ferry's TCP path only (tcp_stream.cc):
  kReady = 3,  // "a receive is posted for your next bulk message `key`: send it" (u32 key)
  kData = 4,   // that message's bytes follow this frame on the stream (u32 key, u64 bytes)
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

// ferry's TCP path reads the stream in pieces of this size while no bulk message is arriving:
// bytes of one that follow its DATA frame in a piece are copied once more, the rest are read
// straight into the receive.
constexpr std::size_t kTcpReadBytes = 256 << 10;

// What a sender said of a bulk message it was about to send.
struct BulkAnnouncement {
  std::uint64_t counter = 0;  // its nonce: the count of announcements before it
  WireProtect protect = WireProtect::kNone;
  std::uint64_t bytes = 0;
  Tag tag{};
};

// One bulk send or receive on ferry's TCP path, shared by its Transfer and the Endpoint,
// which completes it as the stream moves.
struct TcpOp {
  bool receive = false;
  std::uint32_t key = 0;
  // A send's bytes: the caller's, or `staging` (kEncrypt's ciphertext).
  std::span<const std::byte> data;
  std::vector<std::byte> staging;
  // A receive's buffer; its announcement once READY was sent for it.
  std::byte* into = nullptr;
  std::size_t capacity = 0;
  std::optional<BulkAnnouncement> announced;
  bool cancelled = false;  // its Transfer was dropped: the bytes are read and discarded
  std::size_t bytes = 0;   // bytes sent or received so far
  bool finished = false;
  Status status;
};

// The test hooks (testing.h), process-wide.
testing::Tamper& control_tamper();
testing::Tamper& bulk_tamper();

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

LiveEndpoints& live_endpoints();

// What a Channel owns, shared with its Transfers so that they can tell a dead peer from a
// slow one.
struct Endpoint {
  struct PendingSend {
    std::vector<std::byte> frame;
    void* request = nullptr;
  };
  using Announcement = BulkAnnouncement;

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

  // ---- ferry's TCP path (tcp_stream.cc): `bootstrap` carries frames and bulk bytes ----
  // The frame and bulk bytes queued for the socket, in order; `sent` of the front one left.
  struct Outgoing {
    std::vector<std::byte> frame;  // a sealed frame, or empty for a bulk message's bytes
    std::shared_ptr<TcpOp> op;     // that bulk message
    std::size_t sent = 0;
  };
  bool tcp = false;
  bool read_closed = false;  // the stream ended (EOF or an error), read to its end
  std::deque<Outgoing> outgoing;
  std::uint64_t queued = 0;   // items ever put on `outgoing`
  std::uint64_t written = 0;  // ... and ever written whole
  // Sends the peer asked for (its READY came) whose bytes have not started. The front one
  // starts (its DATA frame sealed, its bytes queued) when `outgoing` is empty, so the frames
  // queued meanwhile (the next announcements, READYs) go out ahead of it, not a whole
  // message later: otherwise the peer learns of the next message only when the stream has
  // drained, and the stream idles for a round trip per message.
  std::deque<std::shared_ptr<TcpOp>> asked;
  // Receives we sent READY for whose DATA frame has not come. While there are any, the stream
  // is read no further than the frame being read, or kDataFrameBytes past a frame's start:
  // never into bulk bytes, which are read straight into their receive.
  std::size_t awaiting_data = 0;
  // Sends announced, not yet asked for by the peer's READY; receives posted, in order.
  std::map<std::uint32_t, std::deque<std::shared_ptr<TcpOp>>> unasked;
  std::map<std::uint32_t, std::deque<std::shared_ptr<TcpOp>>> receives;
  std::shared_ptr<TcpOp> inflow;  // the receive whose bytes the stream carries now
  std::uint64_t inflow_left = 0;
  // Where the stream is read while no bulk message arrives (not zero-filled per read), and
  // where a cancelled receive's bytes go.
  std::vector<std::byte> scratch;
  std::uint64_t stream_id = 0;  // ctx's registration of the socket (0: none)

  // Opens the TCP path on `bootstrap`: `early` are bytes read from it past the handshake.
  Status tcp_open(std::vector<std::byte> early);
  // Writes what the socket takes now; true if it wrote anything. Fails the channel when the
  // socket does.
  bool tcp_flush();
  // Reads and opens what the stream holds (see pump()).
  void tcp_pump(bool all);
  // Queues a sealed frame (and flushes).
  void tcp_queue(std::vector<std::byte> frame);
  void tcp_send_bulk(std::shared_ptr<TcpOp> op);
  Status tcp_receive_bulk(const std::shared_ptr<TcpOp>& op);
  // Progresses `op` (reads, writes); true once it finished.
  bool tcp_progress(TcpOp& op);
  // A Transfer dropped `op` unfinished.
  void tcp_abandon(const std::shared_ptr<TcpOp>& op);
  Status tcp_send(std::span<const std::byte> message, const Deadline& deadline);
  void tcp_close();
  // Reads up to `n` bytes into `to`: the count, 0 when none is there now. The peer's end
  // or a socket error fails the channel (and returns 0).
  std::size_t tcp_read(std::byte* to, std::size_t n);
  void tcp_offer_ready(std::uint32_t key);
  // Starts the front of `asked`: seals its DATA frame and queues it and the bytes; false
  // (the channel failed) when sealing failed.
  bool tcp_start_asked();
  void tcp_on_ready(std::span<const std::byte> payload);
  void tcp_on_data(std::span<const std::byte> payload);
  // Moves the inflowing message's bytes from the inbox, then the socket; false while more
  // are due.
  bool tcp_fill_inflow();
  void tcp_finish_inflow();
  // Ends every bulk message in flight with the channel's error.
  void tcp_fail_ops();

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
    if (tcp) return;
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
    // On ferry's TCP path the stream is the socket: the reads that take its frames and bulk
    // bytes see its end (tcp_read), in order, after what came before.
    if (tcp) return;
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
    if (tcp || ep == nullptr) return;
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
    if (tcp) {
      tcp_pump(all);
      return;
    }
    pull();
    while (!inbox_closed && (!failed || broken) && (all || ready.empty())) {
      if (!open_frame()) return;
    }
  }

  // Opens the inbox's next frame and acts on it; false when no whole frame is there, or the
  // frame ended the inbox.
  bool open_frame() {
    const std::size_t have = inbox.size() - inbox_start;
    if (have < kFrameHeaderBytes) return false;
    std::byte* frame = inbox.data() + inbox_start;
    const std::uint32_t length =
        coding::Reader(std::span<const std::byte>(frame, kFrameHeaderBytes)).u32();
    if (length < kFrameOverhead || length > max_message_bytes() + kFrameOverhead) {
      reject(corruption(fmt::format("{} sent a frame of {} bytes; the limit here is {}", peer,
                                    length, max_message_bytes() + kFrameOverhead)));
      return false;
    }
    if (have < kFrameHeaderBytes + length) return false;
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
      return false;
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
        if (unread_limit_passed()) return false;
        break;
      case FrameKind::kFin:
        // The peer closes after the messages before this one (in `ready`).
        fin_received = true;
        send_fin();
        reject(aborted(fmt::format("{} closed the connection", peer)));
        return false;
      case FrameKind::kAnnounce: {
        const std::optional<std::uint32_t> key = announce(payload);
        if (!key) return false;
        if (tcp) tcp_offer_ready(*key);
        break;
      }
      case FrameKind::kReady:
        if (!tcp) return unknown_kind(kind);
        tcp_on_ready(payload);
        break;
      case FrameKind::kData:
        if (!tcp) return unknown_kind(kind);
        tcp_on_data(payload);
        break;
      default:
        return unknown_kind(kind);
    }
    return !inbox_closed;
  }

  bool unknown_kind(FrameKind kind) {
    reject(corruption(
        fmt::format("{} sent a frame of unknown kind {}", peer, static_cast<int>(kind))));
    return false;
  }

  // Records an announcement; its key, or nullopt when it failed the channel.
  std::optional<std::uint32_t> announce(std::span<const std::byte> payload) {
    coding::Reader r(payload);
    const std::uint32_t key = r.u32();
    Announcement a;
    const std::uint8_t protect = r.u8();
    a.bytes = r.u64();
    const std::string tag = r.bytes(kTagBytes);
    if (!r.ok() || r.remaining() != 0 ||
        protect > static_cast<std::uint8_t>(WireProtect::kEncrypt)) {
      reject(corruption(fmt::format("{} sent a malformed bulk announcement", peer)));
      return std::nullopt;
    }
    if (announcements >= kMaxAnnouncements) {
      reject(corruption(fmt::format("{} announced more than {} bulk messages nobody received", peer,
                                    kMaxAnnouncements)));
      return std::nullopt;
    }
    a.protect = static_cast<WireProtect>(protect);
    a.counter = bulk_announced++;
    std::memcpy(a.tag.data(), tag.data(), kTagBytes);
    announced[key].push_back(a);
    ++announcements;
    return key;
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
    auto sealed = seal_frame(kind, payload);
    if (!sealed.ok()) return sealed.status();
    PendingSend ps;
    ps.frame = std::move(*sealed);
    if (tcp) {
      tcp_queue(std::move(ps.frame));
      if (failed) return error;
      return nullptr;
    }
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

  // Seals (kind, payload) into the next frame of this direction: it takes the next nonce, so
  // frames must reach the stream in the order they are sealed.
  Result<std::vector<std::byte>> seal_frame(FrameKind kind, std::span<const std::byte> payload) {
    std::vector<std::byte> frame;
    const auto length = static_cast<std::uint32_t>(payload.size() + kFrameOverhead);
    frame.reserve(kFrameHeaderBytes + length);
    coding::put_u32(&frame, length);  // kFrameHeaderBytes
    frame.resize(kFrameHeaderBytes + length);
    if (!payload.empty()) {
      std::memcpy(frame.data() + kFrameHeaderBytes, payload.data(), payload.size());
    }
    frame[kFrameHeaderBytes + payload.size()] = static_cast<std::byte>(kind);
    const std::span<std::byte> plain(frame.data() + kFrameHeaderBytes, 1 + payload.size());
    Tag tag{};
    Status s =
        aead_seal(keys.control_send, frames_sent++,
                  std::span<const std::byte>(frame.data(), kFrameHeaderBytes), plain, plain, &tag);
    if (!s.ok()) return s;
    std::memcpy(frame.data() + kFrameHeaderBytes + 1 + payload.size(), tag.data(), kTagBytes);
    return frame;
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
    if (tcp) return tcp_send(message, deadline);
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
    if (fin_sent || broken || (ep == nullptr && !tcp)) return;
    fin_sent = true;
    // The peer reads nothing after a FIN: the bulk messages it asked for go first.
    while (tcp && !asked.empty()) tcp_start_asked();
    (void)post(FrameKind::kFin, {});
  }

  void close() {
    if (tcp) {
      tcp_close();
      return;
    }
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

}  // namespace ferry::net

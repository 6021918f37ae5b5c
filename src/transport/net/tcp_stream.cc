// ferry's own TCP path: after the handshake, the authenticated bootstrap socket carries the
// sealed control frames and the bulk messages, and no UCX code runs (docs/transport-net.md).
//
// A bulk message goes by rendezvous: the sender announces it (ANNOUNCE, as on UCX's path);
// once a receive is posted for that key the receiver answers READY; only then does the sender
// write a DATA frame and, straight after it, the message's bytes, which the receiver reads
// into the posted buffer. So nothing a peer sends is held for a receive not posted (there is
// no unexpected queue to flood), and a receiver that stops reading stops its sender through
// TCP's own flow control.
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/net/endpoint.h"

namespace ferry::net {
namespace {

// The DATA frame's payload: u32 key, u64 bytes.
constexpr std::size_t kDataBytes = 4 + 8;
// A whole DATA frame. Every frame is at least kFrameHeaderBytes + kFrameOverhead (21) bytes,
// so reading this many bytes from a frame's start never reaches past the end of a DATA frame
// that follows it: while a DATA frame may come, frames are read in pieces of this size at
// most (then exactly to their end) and the bulk bytes after it stay in the socket.
constexpr std::size_t kDataFrameBytes = kFrameHeaderBytes + kDataBytes + kFrameOverhead;
// Queue items one sendmsg() writes at most.
constexpr std::size_t kMaxIovecs = 16;
// Bytes one sendmsg() offers at most. One call per socket buffer's worth (MiBs) holds the
// socket through the whole copy and lets the receiver copy data long out of cache; on
// loopback 256 KiB pieces moved 64 MiB buckets about 15% faster with less CPU per GB on
// both sides (docs/benchmarks.md, issue 33).
constexpr std::size_t kMaxSendBytes = 256 << 10;

}  // namespace

Status Endpoint::tcp_open(std::vector<std::byte> early) {
  tcp = true;
  transports = "tcp (ferry)";
  const int fd = bootstrap.get();
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // READY is tiny
  inbox = std::move(early);
  auto id = ctx->add_stream(fd, [this] { return tcp_flush(); });
  if (!id.ok()) return id.status();
  stream_id = *id;
  return ok_status();
}

std::size_t Endpoint::tcp_read(std::byte* to, std::size_t n) {
  // A write that failed (the peer closed) leaves what it sent before readable: its last
  // message may be its ERROR. So reading goes on until the stream's own end.
  if (!bootstrap.valid() || read_closed) return 0;
  while (true) {
    const ssize_t got = ::recv(bootstrap.get(), to, n, MSG_DONTWAIT);
    if (got > 0) return static_cast<std::size_t>(got);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    read_closed = true;
    broken = true;
    if (got == 0) {
      fail(aborted(fmt::format(
          "{} is gone: its connection closed (its process exited or was killed, or the network "
          "between us failed)",
          peer)));
    } else {
      fail(aborted(fmt::format("{} is gone: {}", peer, std::strerror(errno))));
    }
    return 0;
  }
}

bool Endpoint::tcp_flush() {
  bool wrote = false;
  while (bootstrap.valid() && !broken) {
    if (outgoing.empty()) {  // every frame sealed so far is out: the next asked bulk message
      if (asked.empty() || !tcp_start_asked()) break;
    }
    iovec iov[kMaxIovecs];
    std::size_t count = 0;
    std::size_t offered = 0;
    for (auto it = outgoing.begin();
         it != outgoing.end() && count < kMaxIovecs && offered < kMaxSendBytes; ++it) {
      const std::span<const std::byte> whole =
          it->op ? it->op->data : std::span<const std::byte>(it->frame);
      const std::size_t piece = std::min(whole.size() - it->sent, kMaxSendBytes - offered);
      iov[count].iov_base = const_cast<std::byte*>(whole.data() + it->sent);
      iov[count].iov_len = piece;
      offered += piece;
      ++count;
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = count;
    const ssize_t n = ::sendmsg(bootstrap.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0) {
      broken = true;
      fail(aborted(fmt::format("{} is gone: {}", peer, std::strerror(errno))));
      tcp_fail_ops();
      break;
    }
    wrote = wrote || n > 0;
    auto left = static_cast<std::size_t>(n);
    while (left > 0) {
      Outgoing& o = outgoing.front();
      const std::size_t size = o.op ? o.op->data.size() : o.frame.size();
      const std::size_t step = std::min(left, size - o.sent);
      o.sent += step;
      left -= step;
      if (o.op) o.op->bytes = o.sent;
      if (o.sent < size) break;
      if (o.op) {
        o.op->finished = true;
        o.op->status = ok_status();
        give_back_staging(std::move(o.op->staging));
      }
      outgoing.pop_front();
      ++written;
    }
  }
  return wrote;
}

void Endpoint::tcp_queue(std::vector<std::byte> frame) {
  outgoing.push_back({std::move(frame), nullptr, 0});
  ++queued;
  tcp_flush();
}

Status Endpoint::tcp_send(std::span<const std::byte> message, const Deadline& deadline) {
  auto posted = post(FrameKind::kMessage, message);
  if (!posted.ok()) return posted.status();
  const std::uint64_t mine = queued;
  while (written < mine) {
    if (failed) return error;
    if (deadline.passed()) {
      return timeout_error(fmt::format("{} did not take our message in time", peer));
    }
    // The peer may be writing to us as we write to it: read what it sent (bounded by the
    // unread limits) so that neither waits for the other.
    pump(/*all=*/true);
    ctx->wait(std::min(deadline.left(), kPeerCheck));
    tcp_flush();
  }
  return ok_status();
}

void Endpoint::tcp_send_bulk(std::shared_ptr<TcpOp> op) {
  unasked[op->key].push_back(std::move(op));
}

Status Endpoint::tcp_receive_bulk(const std::shared_ptr<TcpOp>& op) {
  auto& queue = receives[op->key];
  for (const auto& p : queue) {
    if (!p->cancelled) {
      return failed_precondition(
          fmt::format("a receive for bulk message {} from {} is already posted", op->key, peer));
    }
  }
  queue.push_back(op);
  tcp_offer_ready(op->key);
  return ok_status();
}

// Sends READY for the first receive of `key` not yet asked for, once its announcement is here.
void Endpoint::tcp_offer_ready(std::uint32_t key) {
  auto p = receives.find(key);
  if (p == receives.end()) return;
  auto a = announced.find(key);
  if (a == announced.end()) return;
  for (auto& op : p->second) {
    if (op->announced) continue;
    op->announced = a->second.front();
    a->second.pop_front();
    if (a->second.empty()) announced.erase(a);
    --announcements;
    ++awaiting_data;
    std::vector<std::byte> payload;
    coding::put_u32(&payload, key);
    (void)post(FrameKind::kReady, payload);
    return;
  }
}

void Endpoint::tcp_on_ready(std::span<const std::byte> payload) {
  coding::Reader r(payload);
  const std::uint32_t key = r.u32();
  if (!r.ok() || r.remaining() != 0) {
    reject(corruption(fmt::format("{} sent a malformed READY", peer)));
    return;
  }
  auto it = unasked.find(key);
  if (it == unasked.end()) {
    reject(corruption(
        fmt::format("{} asked for bulk message {}, which this end has not announced", peer, key)));
    return;
  }
  asked.push_back(std::move(it->second.front()));
  it->second.pop_front();
  if (it->second.empty()) unasked.erase(it);
  tcp_flush();
}

bool Endpoint::tcp_start_asked() {
  std::shared_ptr<TcpOp> op = std::move(asked.front());
  asked.pop_front();
  std::vector<std::byte> header;
  coding::put_u32(&header, op->key);
  coding::put_u64(&header, op->data.size());
  // Sealed now, so its nonce follows every frame queued before it; the bytes follow their
  // DATA frame at once: nothing else is queued between the two.
  auto frame = seal_frame(FrameKind::kData, header);
  if (!frame.ok()) {
    fail(frame.status());
    op->finished = true;
    op->status = error;
    return false;
  }
  outgoing.push_back({std::move(*frame), nullptr, 0});
  outgoing.push_back({{}, std::move(op), 0});
  queued += 2;
  return true;
}

void Endpoint::tcp_on_data(std::span<const std::byte> payload) {
  coding::Reader r(payload);
  const std::uint32_t key = r.u32();
  const std::uint64_t bytes = r.u64();
  if (!r.ok() || r.remaining() != 0 || payload.size() != kDataBytes) {
    reject(corruption(fmt::format("{} sent a malformed DATA frame", peer)));
    return;
  }
  auto it = receives.find(key);
  if (it == receives.end() || !it->second.front()->announced) {
    reject(corruption(fmt::format(
        "{} sent the bytes of bulk message {}, which this end did not ask for", peer, key)));
    return;
  }
  const std::shared_ptr<TcpOp> op = it->second.front();
  if (bytes != op->announced->bytes) {
    reject(corruption(fmt::format("{} announced {} bytes for bulk message {} and sent {}", peer,
                                  op->announced->bytes, key, bytes)));
    return;
  }
  --awaiting_data;
  inflow = op;
  inflow_left = bytes;
  if (bytes > op->capacity && !op->cancelled) {
    op->finished = true;
    op->status = corruption(fmt::format(
        "{} sent bulk message {} larger than the {} bytes posted for it", peer, key, op->capacity));
  }
  it->second.pop_front();
  if (it->second.empty()) receives.erase(it);
  if (inflow_left == 0) tcp_finish_inflow();
}

bool Endpoint::tcp_fill_inflow() {
  while (inflow_left > 0) {
    TcpOp& op = *inflow;
    const bool keep = !op.cancelled && !op.finished;  // else the bytes are read and dropped
    std::byte* to = nullptr;
    std::size_t room = inflow_left;
    if (keep) {
      to = op.into + op.bytes;
    } else {
      if (scratch.empty()) scratch.resize(kTcpReadBytes);
      to = scratch.data();
      room = std::min<std::uint64_t>(room, scratch.size());
    }
    std::size_t n = 0;
    if (inbox_start < inbox.size()) {  // read past the DATA frame with it
      n = std::min(room, inbox.size() - inbox_start);
      std::memcpy(to, inbox.data() + inbox_start, n);
      inbox_start += n;
      if (inbox_start == inbox.size()) {
        inbox.clear();
        inbox_start = 0;
      }
    } else {
      n = tcp_read(to, room);
      if (n == 0) return false;
    }
    if (keep) op.bytes += n;
    inflow_left -= n;
  }
  tcp_finish_inflow();
  return true;
}

void Endpoint::tcp_finish_inflow() {
  std::shared_ptr<TcpOp> op = std::move(inflow);
  inflow_left = 0;
  if (op->cancelled || op->finished) return;
  op->finished = true;
  op->status = check_bulk(*op->announced, op->key, std::span<std::byte>(op->into, op->bytes));
}

void Endpoint::tcp_pump(bool all) {
  while (true) {
    if (inflow) {
      if (!tcp_fill_inflow()) break;
      continue;
    }
    if (inbox_closed || (failed && !broken)) break;
    if (!all && !ready.empty()) break;
    if (open_frame()) continue;
    if (inbox_closed || (failed && !broken)) break;
    // No whole frame: read another piece, holding at most a frame ahead of what is opened.
    const std::size_t have = inbox.size() - inbox_start;
    if (have >= kMaxFrameBytes) break;
    if (inbox_start > 0 && inbox_start == inbox.size()) {
      inbox.clear();
      inbox_start = 0;
    }
    std::size_t frame_left = 0;  // to the end of the frame at inbox_start, once its length is in
    if (have >= kFrameHeaderBytes) {
      const std::uint32_t length =
          coding::Reader(std::span<const std::byte>(inbox.data() + inbox_start, kFrameHeaderBytes))
              .u32();
      frame_left = kFrameHeaderBytes + length - have;  // open_frame() checked the length
    }
    std::size_t want = std::max(kTcpReadBytes, frame_left);
    if (awaiting_data > 0) {  // a DATA frame may be next: its bytes go straight into the receive
      want = have < kFrameHeaderBytes ? kDataFrameBytes - have : frame_left;
    }
    std::size_t n = 0;
    if (want <= kTcpReadBytes) {  // the usual case: read into scratch, keep what came
      if (scratch.size() < kTcpReadBytes) scratch.resize(kTcpReadBytes);
      n = tcp_read(scratch.data(), want);
      inbox.insert(inbox.end(), scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(n));
    } else {  // the rest of a large frame (a BEGIN): straight into the inbox
      const std::size_t old = inbox.size();
      inbox.resize(old + want);
      n = tcp_read(inbox.data() + old, want);
      inbox.resize(old + n);
    }
    if (n == 0) break;
  }
  // A dead peer leaves the bulk messages in flight unfinished: end them with its error.
  if (failed && broken && !inflow) tcp_fail_ops();
}

bool Endpoint::tcp_progress(TcpOp& op) {
  if (!op.finished) {
    tcp_flush();
    pump(/*all=*/true);
    tcp_flush();
  }
  if (!op.finished && failed) {
    op.finished = true;
    op.status = error;
  }
  return op.finished;
}

void Endpoint::tcp_fail_ops() {
  const auto end = [&](const std::shared_ptr<TcpOp>& op) {
    if (op->finished) return;
    op->finished = true;
    op->status = error;
  };
  for (auto& [key, ops] : unasked) std::for_each(ops.begin(), ops.end(), end);
  std::for_each(asked.begin(), asked.end(), end);
  for (auto& [key, ops] : receives) std::for_each(ops.begin(), ops.end(), end);
  for (auto& o : outgoing) {
    if (o.op) end(o.op);
  }
  if (inflow) end(inflow);
}

void Endpoint::tcp_abandon(const std::shared_ptr<TcpOp>& op) {
  if (op->finished) return;
  if (op->receive) {
    op->cancelled = true;  // its bytes, when they come, are read and dropped
    if (!op->announced) {  // not asked for yet: it never will be
      auto it = receives.find(op->key);
      if (it != receives.end()) {
        std::erase(it->second, op);
        if (it->second.empty()) receives.erase(it);
      }
    }
    return;
  }
  // A send: the stream must carry its bytes whole or the channel cannot go on. Wait a bounded
  // time, as UCX's path does; after that the caller may reuse the memory, so fail the channel.
  const auto deadline = Clock::now() + (failed ? milliseconds(0) : kCloseFlushTimeout);
  while (!tcp_progress(*op) && Clock::now() < deadline) ctx->wait(milliseconds(10));
  if (op->finished) return;
  broken = true;
  fail(aborted(fmt::format("a bulk send to {} was dropped before it was sent whole", peer)));
  tcp_fail_ops();
  std::erase_if(outgoing, [](const Outgoing& o) { return o.op != nullptr; });
  asked.clear();
  if (bootstrap.valid()) (void)::shutdown(bootstrap.get(), SHUT_RDWR);
}

void Endpoint::tcp_close() {
  if (!bootstrap.valid()) return;
  // As on UCX's path: FIN after our last messages, then wait (bounded) for the peer's, which it
  // sends once it has read everything before ours.
  if (!broken && linger && !fin_received) {
    send_fin();
    const auto deadline = Clock::now() + kFinTimeout;
    while (!fin_received && !broken && Clock::now() < deadline) {
      while (true) {  // discard what the caller never read, looking for the FIN
        auto m = take(max_message_bytes());
        if (!m.ok() || !m->has_value()) break;
      }
      tcp_flush();
      if (fin_received || broken) break;
      ctx->wait(milliseconds(10));
    }
  }
  if (!broken && linger) {
    const auto deadline = Clock::now() + kCloseFlushTimeout;
    while ((!outgoing.empty() || !asked.empty()) && !broken && Clock::now() < deadline) {
      tcp_flush();
      if (!outgoing.empty() || !asked.empty()) ctx->wait(milliseconds(10));
    }
  }
  if (stream_id != 0) ctx->remove_stream(stream_id, bootstrap.get());
  stream_id = 0;
  if (!failed) {
    failed = true;
    error = failed_precondition(fmt::format("the channel to {} is closed", peer));
  }
  tcp_fail_ops();
  outgoing.clear();
  asked.clear();
  bootstrap.reset();  // the peer learns at once that this end is gone
}

}  // namespace ferry::net

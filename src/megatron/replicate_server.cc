// The replicate server: offers a verl / Megatron folder's metadata files (or, in file-set
// mode, what ReplicateServeOptions::offer returns) to pullers over the transport its
// address picks (transport/registry.h: net for "host:port", shm for "@name"), answering
// each peer's requests in turn without blocking on any.
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <deque>
#include <filesystem>
#include <memory>

#include "base/clock.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "ferry/checkpoint.h"
#include "megatron/megatron_dist_checkpoint.h"
#include "megatron/replicate.h"
#include "megatron/replicate_common.h"
#include "megatron/replicate_files.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace ferry::checkpoint {
namespace {

using std::chrono::milliseconds;
namespace rp = replicate;

// Messages per peer posted to the channel and not yet sent: beyond it, the rest wait in
// `outbox`.
constexpr std::size_t kSendWindow = 4;

struct Peer {
  std::unique_ptr<transport::Channel> channel;
  ReplicaSet offered;  // the last INDEX it was sent: the only files it may GET
  // What the server has answered and not yet posted. Nothing is sent blocking, so a
  // peer that stops reading holds up only itself; its next request is read once this and
  // the window are empty.
  std::deque<std::vector<std::byte>> outbox;
  Clock::time_point last_progress = Clock::now();
  std::size_t in_flight = 0;
  // The file being sent, cut into CHUNKs as the window allows: whole in `file_bytes`
  // (Megatron metadata), or read a chunk at a time from `file_fd` (file-set mode: shards of
  // many GB), `file_size` bytes.
  std::string file_path, file_bytes;
  ScopedFd file_fd;
  std::uint64_t file_size = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t file_total() const { return file_fd.valid() ? file_size : file_bytes.size(); }
  void end_file() {
    file_bytes.clear();
    file_fd.reset();
    file_size = file_offset = 0;
  }
  // As of the last pump(), which counts the posted messages still queued in `in_flight`.
  bool idle() const { return outbox.empty() && file_offset >= file_total() && in_flight == 0; }
};

// The server's answers go to the peer's outbox (Peer::pump sends them).
Status queue(Peer& p, std::vector<std::byte> m) {
  p.outbox.push_back(std::move(m));
  return ok_status();
}

class Server {
 public:
  explicit Server(const ReplicateServeOptions& o) : o_(o) {}

  // Answers one message; `done` when the peer said DONE. An error drops the peer.
  Status handle(Peer& p, std::span<const std::byte> m, bool* done) {
    const std::string& who = p.channel->peer();
    auto kind = rp::decode_kind(m, who);
    if (!kind.ok()) return kind.status();
    switch (*kind) {
      case rp::Kind::kList: {
        auto set = o_.offer ? offer() : megatron::replica_set(o_.root, hashes_);
        if (!set.ok()) {
          log::warn("replicate: {}", set.status().message());
          return queue(p, rp::encode_error(rp::ErrorCode::kIo, set.status().message()));
        }
        p.offered = std::move(*set);
        return queue(p, rp::encode_index(p.offered));
      }
      case rp::Kind::kGet: {
        auto want = rp::decode_get(m, who);
        if (!want.ok()) return want.status();
        return send_file(p, *want);
      }
      case rp::Kind::kDone:
        *done = true;
        return ok_status();
      default:
        (void)queue(p, rp::encode_error(rp::ErrorCode::kBadRequest, "unexpected message"));
        return corruption(fmt::format("replicate: {} sent a message only a server sends", who));
    }
  }

 private:
  // File-set mode: the caller's offer, its paths checked as a puller checks them (relative,
  // no "." or ".."), so a GET can never name a file outside the root.
  Result<ReplicaSet> offer() {
    auto set = o_.offer();
    if (!set.ok()) return set.status();
    for (const ReplicaFile& f : set->files) {
      FERRY_RETURN_IF_ERROR(validate_relative_path(f.path, "offered file"));
    }
    return set;
  }

  Status send_file(Peer& p, const ReplicaFile& want) {
    const auto offered = std::find_if(p.offered.files.begin(), p.offered.files.end(),
                                      [&](const ReplicaFile& f) { return f.path == want.path; });
    if (offered == p.offered.files.end()) {
      // Only what the last INDEX offered is ever read: a GET cannot name another file.
      log::warn("replicate: {} asked for '{}', which was not offered", p.channel->peer(),
                want.path);
      return queue(
          p, rp::encode_error(rp::ErrorCode::kNotOffered, "'" + want.path + "' is not offered"));
    }
    // Opened from the root's fd, each component with O_NOFOLLOW, checked with fstat on the
    // fd it is read from: a file swapped for a link after the INDEX is refused, never
    // followed. Read whole (metadata files are small), not mapped: a file truncated while it
    // is sent (a re-save) must not SIGBUS the server.
    const auto changed = [&] {
      return queue(
          p, rp::encode_error(rp::ErrorCode::kChanged, want.path + " changed since it was listed"));
    };
    if (o_.offer) return stream_file(p, want, *offered, changed);
    auto root = megatron::open_root(o_.root);
    if (!root.ok()) return root.status();
    struct stat st {};
    auto text = megatron::read_beneath(root->get(), o_.root, want.path, &st);
    if (!text.ok()) {
      const Code c = text.status().code();
      if (c != Code::kNotFound && c != Code::kFailedPrecondition) return text.status();
      if (c == Code::kFailedPrecondition) log::warn("replicate: {}", text.status().message());
      return changed();
    }
    const std::span<const std::byte> bytes = as_bytes(*text);
    // What goes out is hashed from the buffer it is sent from, so FILE never vouches for other
    // bytes.
    if (bytes.size() != offered->bytes || bytes.size() != want.bytes ||
        XXH3_64bits(bytes.data(), bytes.size()) != offered->xxh3 || offered->xxh3 != want.xxh3) {
      return changed();
    }
    FERRY_RETURN_IF_ERROR(queue(p, rp::encode_file(*offered)));
    p.end_file();
    p.file_path = want.path;
    p.file_bytes = std::move(*text);
    return ok_status();
  }

  // File-set mode: the file is opened as above (O_NOFOLLOW beneath the root) and sent a chunk
  // at a time from that fd, never whole in memory. A file whose size differs from the offer
  // gets ERROR changed; one whose bytes changed shows as a wrong XXH3 at the puller, which
  // discards it; one that shrinks while it is sent gets ERROR changed in place of its next CHUNK.
  template <typename Changed>
  Status stream_file(Peer& p, const ReplicaFile& want, const ReplicaFile& offered,
                     const Changed& changed) {
    const auto io_error_answer = [&](const Status& s) {
      log::warn("replicate: {}", s.message());
      return queue(p, rp::encode_error(rp::ErrorCode::kIo, s.message()));
    };
    auto root = megatron::open_root(o_.root);
    if (!root.ok()) return io_error_answer(root.status());
    struct stat st {};
    auto fd = megatron::open_file_beneath(root->get(), o_.root, want.path, &st);
    if (!fd.ok()) {
      // Gone since it was offered: changed. A link or a non-file: refused, and said why.
      if (fd.status().code() == Code::kNotFound) return changed();
      return io_error_answer(fd.status());
    }
    if (static_cast<std::uint64_t>(st.st_size) != offered.bytes || want.bytes != offered.bytes ||
        want.xxh3 != offered.xxh3) {
      return changed();
    }
    // Not hashed here: the puller checks every byte against the XXH3 its caller holds, and a
    // second read of a multi-GB shard would cost as much as sending it.
    FERRY_RETURN_IF_ERROR(queue(p, rp::encode_file(offered)));
    p.end_file();
    p.file_path = want.path;
    if (offered.bytes > 0) {
      p.file_fd = std::move(*fd);
      p.file_size = offered.bytes;
    }
    return ok_status();
  }

  // The CHUNK of `p`'s streamed file at its offset, `n` bytes read from its fd; an ERROR in
  // its place when the file shrank under us or cannot be read (the file ends there).
  std::vector<std::byte> next_streamed_chunk(Peer& p, std::size_t n) {
    std::vector<std::byte> data(n);
    std::size_t have = 0;
    while (have < n) {
      const ssize_t r = ::pread(p.file_fd.get(), data.data() + have, n - have,
                                static_cast<off_t>(p.file_offset + have));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const std::string why =
            r == 0 ? fmt::format("{} shrank to {} bytes while being sent (offered {})", p.file_path,
                                 p.file_offset + have, p.file_size)
                   : errno_status("pread", o_.root + "/" + p.file_path, errno).message();
        log::warn("replicate: {}", why);
        p.end_file();
        return rp::encode_error(r == 0 ? rp::ErrorCode::kChanged : rp::ErrorCode::kIo, why);
      }
      have += static_cast<std::size_t>(r);
    }
    auto m = rp::encode_chunk(p.file_offset, data);
    p.file_offset += n;
    return m;
  }

 public:
  // Posts the peer's queued answers, then its file's next chunks, while its window allows;
  // never waits. Errors: the peer is gone, or it took nothing for send_timeout.
  Status pump(Peer& p) {
    // The seam's limit, which every transport carries (net's frame limit is the same).
    const std::size_t chunk = std::clamp<std::size_t>(
        o_.chunk_bytes, 1, rp::max_chunk_bytes(transport::kMaxMessageBytes));
    auto queued = p.channel->flush_posted();
    if (!queued.ok()) return queued.status();
    std::size_t in_flight = *queued;
    if (in_flight < p.in_flight) p.last_progress = Clock::now();
    while (in_flight < kSendWindow) {
      std::vector<std::byte> m;
      std::size_t sent_to = 0;
      if (!p.outbox.empty()) {
        m = std::move(p.outbox.front());
        p.outbox.pop_front();
      } else if (p.file_offset < p.file_total() && p.file_fd.valid()) {
        const std::size_t n =
            static_cast<std::size_t>(std::min<std::uint64_t>(chunk, p.file_size - p.file_offset));
        m = next_streamed_chunk(p, n);
        sent_to = p.file_offset;  // 0 when an ERROR took the CHUNK's place
      } else if (p.file_offset < p.file_total()) {
        const auto piece =
            as_bytes(p.file_bytes)
                .subspan(p.file_offset,
                         std::min<std::size_t>(chunk, p.file_bytes.size() - p.file_offset));
        m = rp::encode_chunk(p.file_offset, piece);
        sent_to = p.file_offset += piece.size();
      } else {
        break;
      }
      // Queued whole if the peer does not take it now: it is in flight, not lost.
      queued = p.channel->post(std::move(m));
      if (!queued.ok()) return queued.status();
      in_flight = *queued;
      p.last_progress = Clock::now();
      if (sent_to == 0) continue;
      if (o_.test_after_chunk) o_.test_after_chunk(p.file_path, sent_to);
      if (sent_to == p.file_total()) {
        event(fmt::format("sent {} ({} bytes) to {}", p.file_path, sent_to, p.channel->peer()));
        p.end_file();
      }
    }
    p.in_flight = in_flight;
    if (p.idle()) p.last_progress = Clock::now();
    const auto stalled = Clock::now() - p.last_progress;
    if (!p.idle() && stalled > o_.send_timeout) {
      return timeout_error(
          fmt::format("{} stopped reading: it took nothing we sent for {} ms (send timeout {} ms)",
                      p.channel->peer(), std::chrono::duration_cast<milliseconds>(stalled).count(),
                      o_.send_timeout.count()));
    }
    return ok_status();
  }

 public:
  void event(const std::string& e) const {
    log::debug("replicate: {}", e);
    if (o_.on_event) o_.on_event(e);
  }

 private:
  const ReplicateServeOptions& o_;
  megatron::FileHashes hashes_;
};

}  // namespace

Status serve_replicas(const ReplicateServeOptions& o) {
  std::error_code ec;
  if (!std::filesystem::is_directory(o.root, ec))
    return not_found("checkpoint folder " + o.root + " is not a folder");
  if (o.clients < 0) return invalid_argument("clients must be 0 (serve until stopped) or more");
  if (o.send_timeout < milliseconds(1)) {
    return invalid_argument(
        fmt::format("send timeout {} ms: must be at least 1 ms", o.send_timeout.count()));
  }
  // Pullers are untrusted and metadata is small: no zero-copy sends, which a puller ending
  // mid-file would make UCX 1.13 abort on (TransportConfig::copy_sends; shm ignores it).
  transport::Registry transports({.secret_file = o.token_file, .copy_sends = true});
  auto bound = transports.listen(o.address);
  if (!bound.ok()) return bound.status();
  transport::Listener& listener = **bound;
  Server server(o);
  if (o.on_listening) o.on_listening(listener.address());
  // One wait loop for the listener and every peer it accepts (net: one engine hears them all).
  const auto poller = listener.poller();
  std::vector<Peer> peers;
  // Peers dropped while answers posted to them were still queued. Their channels stay open
  // until the peer ends or takes it all: UCX 1.13's TCP transport crashed or hung the server
  // when a peer ended after its endpoint had been forced shut with data queued for it, and
  // on every transport the peer then reads what it was sent before it sees the end.
  std::vector<std::unique_ptr<transport::Channel>> dropped;
  int finished = 0;
  std::vector<pollfd> fds;
  while (!(o.stop && o.stop()) && (o.clients == 0 || finished < o.clients)) {
    bool busy = false, sending = false;
    auto accepted = listener.accept(milliseconds(0));
    if (accepted.ok()) {
      server.event((*accepted)->peer() + " connected");
      peers.push_back({std::move(*accepted), {}});
      busy = true;
    } else if (accepted.status().code() != Code::kTimeout) {
      server.event("refused a peer: " + accepted.status().message());
    }
    poller->progress();
    for (auto it = peers.begin(); it != peers.end();) {
      bool done = false;
      // Each peer's answers go out as it takes them; one that stops reading waits alone
      // and is dropped after send_timeout, the others go on.
      Status st = server.pump(*it);
      if (st.ok() && !it->idle()) {
        sending = true;
        ++it;
        continue;
      }
      if (st.ok()) {
        auto m = rp::receive_now(*it->channel);
        if (m.ok() && !m->has_value()) {
          ++it;
          continue;
        }
        busy = true;
        st = m.ok() ? server.handle(*it, **m, &done) : m.status();
        if (st.ok() && !done) st = server.pump(*it);
      }
      if (st.ok() && !done) {
        ++it;
        continue;
      }
      transport::Channel& ch = *it->channel;
      if (done) {
        ++finished;
        server.event(ch.peer() + " finished");
        ch.close();
      } else {
        // A peer that left (a watch ending) is routine; one that broke the protocol is not.
        if (st.code() == Code::kAborted) {
          server.event(ch.peer() + " left");
        } else {
          log::warn("replicate: dropping {}: {}", ch.peer(), st.message());
          server.event("dropped " + ch.peer() + ": " + st.message());
        }
        if (it->in_flight > 0 && st.code() != Code::kAborted) {
          dropped.push_back(std::move(it->channel));
        } else {
          ch.abort();
        }
      }
      it = peers.erase(it);
    }
    // A dropped peer is read (and what it says discarded) until it ends or takes what was
    // queued for it; then its endpoint closes with nothing left in flight.
    std::erase_if(dropped, [](std::unique_ptr<transport::Channel>& ch) {
      auto m = rp::receive_now(*ch);
      while (m.ok() && m->has_value()) m = rp::receive_now(*ch);  // a flood is not kept
      auto queued = ch->flush_posted();
      if (m.ok() && queued.ok() && *queued > 0) return false;
      ch->abort();
      return true;
    });
    // While answers wait for a peer to take them, look again soon (its completions may not
    // wake the engine's fd). The listener's fd wakes the wait too: each step of a handshake
    // is read at once, not at the next poll interval (4 steps cost 200 ms that way); and so
    // does the fd of each peer polled on its own (shm): readable when it waits for answers,
    // writable when it holds what we posted.
    if (busy) continue;
    fds.assign(1, {listener.fd(), POLLIN, 0});
    for (const Peer& p : peers) {
      fds.push_back({p.channel->poll_fd(), static_cast<short>(p.idle() ? POLLIN : POLLOUT), 0});
    }
    (void)poller->wait(fds, sending ? milliseconds(1) : rp::kPollInterval);
  }
  for (Peer& p : peers) p.channel->close();
  for (auto& ch : dropped) ch->abort();
  return ok_status();
}

}  // namespace ferry::checkpoint

// Replicating verl / Megatron checkpoint metadata across nodes over the net transport:
// the protocol's coding (replicate.h), the server and the puller.
#include "checkpoint/replicate.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <memory>

#include "base/clock.h"
#include "base/file_util.h"
#include "base/log.h"
#include "checkpoint/megatron_folder.h"
#include "ferry/checkpoint.h"
#include "transport/net/channel.h"
#include "base/coding.h"

namespace ferry::checkpoint {
namespace replicate {
namespace {

std::vector<std::byte> header(Kind kind) {
  std::vector<std::byte> out;
  coding::put_u32(&out, kMagic);
  coding::put_u8(&out, kVersion);
  coding::put_u8(&out, static_cast<std::uint8_t>(kind));
  return out;
}

void put_file(std::vector<std::byte>* out, const ReplicaFile& f) {
  coding::put_u16(out, static_cast<std::uint16_t>(f.path.size()));
  coding::put_bytes(out, f.path);
  coding::put_u64(out, f.bytes);
  coding::put_u64(out, f.xxh3);
}

void read_file_entry(coding::Reader& r, ReplicaFile* f) {
  const std::uint16_t n = r.u16();
  if (n > kMaxPathBytes) {
    (void)r.bytes(r.remaining() + 1);  // fails the reader
    return;
  }
  f->path = r.bytes(n);
  f->bytes = r.u64();
  f->xxh3 = r.u64();
}

// A reader past the header, for a message decode_kind() accepted.
coding::Reader body(std::span<const std::byte> m) {
  coding::Reader r(m);
  (void)r.bytes(kHeaderBytes);
  return r;
}

Status malformed(std::string_view what, const std::string& peer) {
  return corruption(fmt::format("replicate: malformed {} message from {}", what, peer));
}

template <typename T>
Result<T> finish(const coding::Reader& r, T value, std::string_view what, const std::string& peer) {
  if (!r.ok() || r.remaining() != 0) return malformed(what, peer);
  return value;
}

}  // namespace

std::vector<std::byte> encode_list() { return header(Kind::kList); }
std::vector<std::byte> encode_done() { return header(Kind::kDone); }

std::vector<std::byte> encode_index(const ReplicaSet& set) {
  auto out = header(Kind::kIndex);
  coding::put_u8(&out, set.tracker ? 1 : 0);
  coding::put_u64(&out, static_cast<std::uint64_t>(set.tracker.value_or(0)));
  const std::size_t notes = std::min(set.notes.size(), kMaxNotes);
  coding::put_u16(&out, static_cast<std::uint16_t>(notes));
  for (std::size_t i = 0; i < notes; ++i) {
    const std::string_view n = std::string_view(set.notes[i]).substr(0, kMaxNoteBytes);
    coding::put_u32(&out, static_cast<std::uint32_t>(n.size()));
    coding::put_bytes(&out, n);
  }
  coding::put_u32(&out, static_cast<std::uint32_t>(set.files.size()));
  for (const ReplicaFile& f : set.files) put_file(&out, f);
  return out;
}

std::vector<std::byte> encode_get(const ReplicaFile& file) {
  auto out = header(Kind::kGet);
  put_file(&out, file);
  return out;
}

std::vector<std::byte> encode_file(const ReplicaFile& file) {
  auto out = header(Kind::kFile);
  put_file(&out, file);
  return out;
}

std::vector<std::byte> encode_chunk(std::uint64_t offset, std::span<const std::byte> data) {
  auto out = header(Kind::kChunk);
  coding::put_u64(&out, offset);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<std::byte> encode_error(ErrorCode code, std::string_view message) {
  auto out = header(Kind::kError);
  coding::put_u8(&out, static_cast<std::uint8_t>(code));
  const std::string_view m = message.substr(0, kMaxNoteBytes);
  coding::put_u32(&out, static_cast<std::uint32_t>(m.size()));
  coding::put_bytes(&out, m);
  return out;
}

std::size_t max_chunk_bytes(std::size_t message_bytes) {
  return message_bytes > kHeaderBytes + 8 ? message_bytes - kHeaderBytes - 8 : 0;
}

Result<Kind> decode_kind(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r(m);
  const std::uint32_t magic = r.u32();
  const std::uint8_t version = r.u8();
  const std::uint8_t kind = r.u8();
  if (!r.ok() || magic != kMagic) {
    return corruption(
        fmt::format("replicate: {} sent a message that is not ferry's replicate "
                    "protocol",
                    peer));
  }
  if (version != kVersion) {
    return corruption(
        fmt::format("replicate: {} speaks protocol version {}, we speak {}: use the "
                    "same ferry version on both nodes",
                    peer, version, kVersion));
  }
  if (kind < static_cast<std::uint8_t>(Kind::kList) ||
      kind > static_cast<std::uint8_t>(Kind::kDone)) {
    return corruption(fmt::format("replicate: {} sent unknown message kind {}", peer, kind));
  }
  // LIST and DONE are a header alone; no decoder of their own checks for trailing bytes.
  const auto k = static_cast<Kind>(kind);
  if ((k == Kind::kList || k == Kind::kDone) && r.remaining() != 0) {
    return corruption(fmt::format("replicate: {} sent a {} with {} unexpected bytes after it",
                                  peer, k == Kind::kList ? "LIST" : "DONE", r.remaining()));
  }
  return k;
}

Result<ReplicaSet> decode_index(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  ReplicaSet set;
  // One encoding per value: a flag of 0 or 1, no step without the flag, no negative step.
  const std::uint8_t has_tracker = r.u8();
  const std::uint64_t tracker = r.u64();
  if (has_tracker > 1 || (has_tracker == 0 && tracker != 0) ||
      tracker > static_cast<std::uint64_t>(INT64_MAX)) {
    return malformed("INDEX", peer);
  }
  if (has_tracker == 1) set.tracker = static_cast<std::int64_t>(tracker);
  const std::uint16_t notes = r.u16();
  if (notes > kMaxNotes) return malformed("INDEX", peer);
  for (std::uint16_t i = 0; i < notes && r.ok(); ++i) {
    const std::uint32_t n = r.u32();
    if (n > kMaxNoteBytes) return malformed("INDEX", peer);
    set.notes.push_back(r.bytes(n));
  }
  const std::uint32_t files = r.u32();
  // Each entry takes at least 18 bytes: a count beyond what is left is a lie.
  if (!r.ok() || files > r.remaining() / 18) return malformed("INDEX", peer);
  set.files.resize(files);
  for (ReplicaFile& f : set.files) read_file_entry(r, &f);
  return finish(r, std::move(set), "INDEX", peer);
}

Result<ReplicaFile> decode_get(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  ReplicaFile f;
  read_file_entry(r, &f);
  return finish(r, std::move(f), "GET", peer);
}

Result<ReplicaFile> decode_file(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  ReplicaFile f;
  read_file_entry(r, &f);
  return finish(r, std::move(f), "FILE", peer);
}

Result<Chunk> decode_chunk(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  Chunk c;
  c.offset = r.u64();
  if (!r.ok()) return malformed("CHUNK", peer);
  c.data = m.subspan(kHeaderBytes + 8);
  return c;
}

Result<Error> decode_error(std::span<const std::byte> m, const std::string& peer) {
  coding::Reader r = body(m);
  Error e;
  e.code = static_cast<ErrorCode>(r.u8());
  const std::uint32_t n = r.u32();
  if (n > kMaxNoteBytes) return malformed("ERROR", peer);
  e.message = r.bytes(n);
  return finish(r, std::move(e), "ERROR", peer);
}

}  // namespace replicate

// ---------------------------------------------------------------------------

namespace {

using std::chrono::milliseconds;
namespace fs = std::filesystem;
namespace rp = replicate;

// How long the puller waits for the server to take a message.
constexpr milliseconds kSendTimeout{60'000};
constexpr milliseconds kPoll{50};

Result<net::Token> load_token(const std::string& token_file) {
  return token_file.empty() ? net::Token::from_env() : net::Token::from_file(token_file);
}

Status send_message(net::Channel& ch, const std::vector<std::byte>& m) {
  return ch.send(m, kSendTimeout);
}

// --- server ---

// Messages per peer handed to UCX and not yet sent: beyond it, the rest wait in `outbox`.
constexpr std::size_t kSendWindow = 4;

struct Peer {
  net::Channel channel;
  ReplicaSet offered;  // the last INDEX it was sent: the only files it may GET
  // What the server has answered and not yet handed to UCX. Nothing is sent blocking, so a
  // peer that stops reading holds up only itself; its next request is read once this and
  // the window are empty.
  std::deque<std::vector<std::byte>> outbox;
  Clock::time_point last_progress = Clock::now();
  std::size_t in_flight = 0;
  // The file being sent, cut into CHUNKs as the window allows.
  std::string file_path, file_bytes;
  std::size_t file_offset = 0;
  bool idle() {
    return outbox.empty() && file_offset >= file_bytes.size() && channel.sends_in_flight() == 0;
  }
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
    const std::string& who = p.channel.peer();
    auto kind = rp::decode_kind(m, who);
    if (!kind.ok()) return kind.status();
    switch (*kind) {
      case rp::Kind::kList: {
        auto set = megatron::replica_set(o_.root, hashes_);
        if (!set.ok()) {
          log::warn("replicate: {}", set.status().message());
          return queue(p,
                              rp::encode_error(rp::ErrorCode::kIo, set.status().message()));
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
        (void)queue(p,
                           rp::encode_error(rp::ErrorCode::kBadRequest, "unexpected message"));
        return corruption(fmt::format("replicate: {} sent a message only a server sends", who));
    }
  }

 private:
  Status send_file(Peer& p, const ReplicaFile& want) {
    const auto offered = std::find_if(p.offered.files.begin(), p.offered.files.end(),
                                      [&](const ReplicaFile& f) { return f.path == want.path; });
    if (offered == p.offered.files.end()) {
      // Only what the last INDEX offered is ever read: a GET cannot name another file.
      log::warn("replicate: {} asked for '{}', which was not offered", p.channel.peer(), want.path);
      return queue(p, rp::encode_error(rp::ErrorCode::kNotOffered,
                                                      "'" + want.path + "' is not offered"));
    }
    // Opened from the root's fd, each component with O_NOFOLLOW, checked with fstat on the
    // fd it is read from: a file swapped for a link after the INDEX is refused, never
    // followed. Read whole (metadata files are small), not mapped: a file truncated while it
    // is sent (a re-save) must not SIGBUS the server.
    const auto changed = [&] {
      return queue(p, rp::encode_error(rp::ErrorCode::kChanged,
                                                      want.path + " changed since it was listed"));
    };
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
    if (Status s = queue(p, rp::encode_file(*offered)); !s.ok()) return s;
    p.file_path = want.path;
    p.file_bytes = std::move(*text);
    p.file_offset = 0;
    return ok_status();
  }

 public:
  // Hands the peer's queued answers, then its file's next chunks, to UCX while its window
  // allows; never waits. Errors: the peer is gone, or it took nothing for send_timeout.
  Status pump(Peer& p) {
    const std::size_t chunk =
        std::clamp<std::size_t>(o_.chunk_bytes, 1, rp::max_chunk_bytes(net::max_message_bytes()));
    std::size_t in_flight = p.channel.sends_in_flight();
    if (in_flight < p.in_flight) p.last_progress = Clock::now();
    while (in_flight < kSendWindow) {
      std::vector<std::byte> m;
      std::size_t sent_to = 0;
      if (!p.outbox.empty()) {
        m = std::move(p.outbox.front());
        p.outbox.pop_front();
      } else if (p.file_offset < p.file_bytes.size()) {
        const auto piece = as_bytes(p.file_bytes)
                               .subspan(p.file_offset,
                                        std::min(chunk, p.file_bytes.size() - p.file_offset));
        m = rp::encode_chunk(p.file_offset, piece);
        sent_to = p.file_offset += piece.size();
      } else {
        break;
      }
      Status st = p.channel.send(m, milliseconds(0));
      // A timeout leaves the message queued in UCX: it is in flight, not lost.
      if (!st.ok() && st.code() != Code::kTimeout) return st;
      in_flight = p.channel.sends_in_flight();
      p.last_progress = Clock::now();
      if (sent_to == 0) continue;
      if (o_.test_after_chunk) o_.test_after_chunk(p.file_path, sent_to);
      if (sent_to == p.file_bytes.size()) {
        event(fmt::format("sent {} ({} bytes) to {}", p.file_path, sent_to, p.channel.peer()));
        p.file_bytes.clear();
        p.file_offset = 0;
      }
    }
    p.in_flight = in_flight;
    if (in_flight == 0 && p.idle()) p.last_progress = Clock::now();
    const auto stalled = Clock::now() - p.last_progress;
    if (!p.idle() && stalled > o_.send_timeout) {
      return timeout_error(fmt::format(
          "{} stopped reading: it took nothing we sent for {} ms (send timeout {} ms)",
          p.channel.peer(), std::chrono::duration_cast<milliseconds>(stalled).count(),
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

// --- puller ---

// Refuses a path from the server that leaves the folder, is not a metadata file or the
// tracker, or passes through a folder that is a symbolic link (which could lead outside).
Status check_offered_path(const std::string& root, const std::string& path,
                          const std::string& peer) {
  if (Status s = validate_relative_path(path, "file offered by " + peer); !s.ok()) {
    return invalid_argument(s.message() + ": refused");
  }
  if (!megatron::is_replica_path(path)) {
    return invalid_argument(
        fmt::format("file offered by {} '{}' is not a Megatron metadata file "
                    "(common.pt, .metadata, metadata.json in a step folder) "
                    "or {}: refused",
                    peer, path, kMegatronTracker));
  }
  // The folders on the way: a clear refusal up front. The writes themselves go through
  // O_NOFOLLOW opens (write_beneath), which is what holds against a link planted later; a
  // link at the file's own name is replaced by the rename, never written through.
  std::string at = root;
  for (std::size_t start = 0; start < path.size();) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) break;
    at += "/" + path.substr(start, end - start);
    struct stat st {};
    if (::lstat(at.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return invalid_argument(
          fmt::format("file offered by {} '{}' would be written through the "
                      "symbolic link {}: refused",
                      peer, path, at));
    }
    start = end + 1;
  }
  return ok_status();
}

struct XxhState {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

class Puller {
 public:
  Puller(const ReplicatePullOptions& o, net::Channel& ch) : o_(o), ch_(ch) {}

  // One LIST and the GETs it calls for. `changed` when the server said a file changed
  // under it (that file and the ones after it wait for the next round).
  Result<PullRound> round(int number, bool* changed, bool* stopped) {
    PullRound out;
    out.round = number;
    if (Status s = send_message(ch_, rp::encode_list()); !s.ok()) return s;
    auto m = receive("INDEX");
    if (!m.ok()) return m.status();
    auto kind = rp::decode_kind(*m, peer());
    if (!kind.ok()) return kind.status();
    if (*kind == rp::Kind::kError) return server_error(*m, "listing");
    if (*kind != rp::Kind::kIndex)
      return corruption("replicate: " + peer() + " answered LIST out of order");
    auto set = rp::decode_index(*m, peer());
    if (!set.ok()) return set.status();
    // Everything is checked before anything is written.
    for (const ReplicaFile& f : set->files) {
      if (Status s = check_offered_path(o_.root, f.path, peer()); !s.ok()) return s;
    }
    std::stable_partition(set->files.begin(), set->files.end(),
                          [](const ReplicaFile& f) { return f.path != kMegatronTracker; });
    out.tracker = set->tracker;
    out.notes = set->notes;
    std::vector<ReplicaFile> need;
    for (const ReplicaFile& f : set->files) {
      auto local = hashes_.get(o_.root, f.path);
      if (local.ok() && local->bytes == f.bytes && local->xxh3 == f.xxh3) {
        ++out.unchanged;
        continue;
      }
      // Missing, or a link where the file goes (replaced by the rename, never followed).
      if (!local.ok() && local.status().code() != Code::kNotFound &&
          local.status().code() != Code::kFailedPrecondition) {
        return local.status();
      }
      need.push_back(f);
    }
    done_ = total_ = 0;
    for (const ReplicaFile& f : need) total_ += f.bytes;
    for (const ReplicaFile& f : need) {
      if (o_.stop && o_.stop()) {
        *stopped = true;
        return out;
      }
      auto got = fetch(f);
      if (!got.ok()) return got.status();
      if (!*got) {
        *changed = true;
        out.notes.push_back(f.path +
                            " changed on the server while being copied; it waits for "
                            "the next round");
        return out;
      }
      out.copied.push_back({f.path, f.bytes});
    }
    return out;
  }

  const std::string& peer() const { return ch_.peer(); }

 private:
  Result<std::vector<std::byte>> receive(std::string_view what) {
    auto m = ch_.receive(o_.timeout);
    if (!m.ok()) return m.status().with_context(fmt::format("replicate: waiting for {}", what));
    return m;
  }

  // An ERROR message from the server as our error.
  Status server_error(std::span<const std::byte> m, std::string_view doing) {
    auto e = rp::decode_error(m, peer());
    if (!e.ok()) return e.status();
    return failed_precondition(
        fmt::format("replicate: {} failed {}: {}", peer(), doing, e->message));
  }

  // Copies one file; false when the server reported it changed.
  Result<bool> fetch(const ReplicaFile& f) {
    if (Status s = send_message(ch_, rp::encode_get(f)); !s.ok()) return s;
    auto m = receive(f.path);
    if (!m.ok()) return m.status();
    auto kind = rp::decode_kind(*m, peer());
    if (!kind.ok()) return kind.status();
    if (*kind == rp::Kind::kError) {
      auto e = rp::decode_error(*m, peer());
      if (!e.ok()) return e.status();
      if (e->code == rp::ErrorCode::kChanged) return false;
      return server_error(*m, f.path);
    }
    if (*kind != rp::Kind::kFile)
      return corruption("replicate: " + peer() + " answered GET out of order");
    auto head = rp::decode_file(*m, peer());
    if (!head.ok()) return head.status();
    if (head->path != f.path || head->bytes != f.bytes || head->xxh3 != f.xxh3) {
      return corruption(
          fmt::format("replicate: {} sent '{}' ({} bytes) when asked for '{}' ({} "
                      "bytes)",
                      peer(), head->path, head->bytes, f.path, f.bytes));
    }
    // Kept in memory until whole and checked (metadata files are small): a server that dies
    // mid-file leaves nothing behind.
    std::vector<std::byte> content;
    std::unique_ptr<XXH3_state_t, XxhState> hash(XXH3_createState());
    if (!hash || XXH3_64bits_reset(hash.get()) != XXH_OK) return internal_error("XXH3 state");
    std::uint64_t received = 0;
    while (received < f.bytes) {
      auto c = receive("CHUNK");
      if (!c.ok())
        return c.status().with_context(
            fmt::format("{} at byte {} of {}", f.path, received, f.bytes));
      auto k = rp::decode_kind(*c, peer());
      if (!k.ok()) return k.status();
      if (*k != rp::Kind::kChunk)
        return corruption("replicate: " + peer() + " interrupted " + f.path);
      auto chunk = rp::decode_chunk(*c, peer());
      if (!chunk.ok()) return chunk.status();
      if (chunk->offset != received || chunk->data.size() > f.bytes - received ||
          chunk->data.empty()) {
        return corruption(
            fmt::format("replicate: {} sent bytes [{}, +{}) of {} out of order or "
                        "past its {} bytes",
                        peer(), chunk->offset, chunk->data.size(), f.path, f.bytes));
      }
      content.insert(content.end(), chunk->data.begin(), chunk->data.end());
      XXH3_64bits_update(hash.get(), chunk->data.data(), chunk->data.size());
      received += chunk->data.size();
      done_ += chunk->data.size();
      if (o_.progress) o_.progress(done_, total_);
    }
    if (const std::uint64_t got = XXH3_64bits_digest(hash.get()); got != f.xxh3) {
      return corruption(
          fmt::format("replicate: {} from {} has XXH3 {:016x}, not the {:016x} it "
                      "was offered with; discarded",
                      f.path, peer(), got, f.xxh3));
    }
    // Written through the folder's fd: a temp name made with O_EXCL|O_NOFOLLOW, renamed
    // over the target, every folder on the way opened with O_NOFOLLOW. A link planted in
    // the destination is replaced or refused, never written through.
    std::error_code ec;
    fs::create_directories(o_.root, ec);
    if (ec) return errno_status("mkdir", o_.root, ec.value());
    auto root = megatron::open_root(o_.root);
    if (!root.ok()) return root.status();
    if (Status s = megatron::write_beneath(root->get(), o_.root, f.path, content); !s.ok()) {
      return s.with_context("replicate: writing " + f.path);
    }
    return true;
  }

  const ReplicatePullOptions& o_;
  net::Channel& ch_;
  megatron::FileHashes hashes_;
  std::uint64_t done_ = 0, total_ = 0;  // bytes of this round's copies, for `progress`
};

}  // namespace

Status serve_replicas(const ReplicateServeOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.root, ec))
    return not_found("checkpoint folder " + o.root + " is not a folder");
  if (o.clients < 0) return invalid_argument("clients must be 0 (serve until stopped) or more");
  if (o.send_timeout < milliseconds(1)) {
    return invalid_argument(
        fmt::format("send timeout {} ms: must be at least 1 ms", o.send_timeout.count()));
  }
  auto token = load_token(o.token_file);
  if (!token.ok()) return token.status();
  auto ctx = net::Context::create();
  if (!ctx.ok()) return ctx.status();
  auto listener = net::Listener::bind(*ctx, o.address, std::move(*token));
  if (!listener.ok()) return listener.status();
  Server server(o);
  if (o.on_listening) o.on_listening(listener->address());
  std::vector<Peer> peers;
  int finished = 0;
  while (!(o.stop && o.stop()) && (o.clients == 0 || finished < o.clients)) {
    bool busy = false, sending = false;
    auto accepted = listener->accept(milliseconds(0));
    if (accepted.ok()) {
      server.event(accepted->peer() + " connected");
      peers.push_back({std::move(*accepted), {}});
      busy = true;
    } else if (accepted.status().code() != Code::kTimeout) {
      server.event("refused a peer: " + accepted.status().message());
    }
    (*ctx)->progress();
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
        auto m = it->channel.try_receive();
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
      if (done) {
        ++finished;
        server.event(it->channel.peer() + " finished");
        it->channel.close();
      } else {
        // A peer that left (a watch ending) is routine; one that broke the protocol is not.
        if (st.code() == Code::kAborted) {
          server.event(it->channel.peer() + " left");
        } else {
          log::warn("replicate: dropping {}: {}", it->channel.peer(), st.message());
          server.event("dropped " + it->channel.peer() + ": " + st.message());
        }
        it->channel.abort();
      }
      it = peers.erase(it);
    }
    // While answers wait for a peer to take them, look again soon (its completions may not
    // wake the event fd).
    if (!busy) (*ctx)->wait(sending ? milliseconds(1) : kPoll);
  }
  for (Peer& p : peers) p.channel.close();
  return ok_status();
}

Result<PullResult> pull_replicas(const ReplicatePullOptions& o) {
  if (o.root.empty()) return invalid_argument("no checkpoint folder to pull into");
  if (o.from.empty()) return invalid_argument("no server address to pull from (--from HOST:PORT)");
  if (o.watch &&
      (o.watch_interval < milliseconds(10) || o.watch_interval > milliseconds(3'600'000))) {
    return invalid_argument(
        fmt::format("watch interval {} ms is outside 10 ms .. 1 h", o.watch_interval.count()));
  }
  std::error_code ec;
  if (fs::exists(o.root, ec) && !fs::is_directory(o.root, ec)) {
    return failed_precondition(o.root + " exists and is not a folder");
  }
  auto token = load_token(o.token_file);
  if (!token.ok()) return token.status();
  auto ctx = net::Context::create();
  if (!ctx.ok()) return ctx.status();
  auto ch = net::connect(*ctx, o.from, *token, o.timeout, {.role = "replicate server"});
  if (!ch.ok()) return ch.status();
  Puller puller(o, *ch);
  PullResult result;
  // A one-shot pull lists again when a file changed under the server, a few times.
  constexpr int kOnceRounds = 3;
  while (true) {
    bool changed = false, stopped = false;
    auto r = puller.round(result.rounds + 1, &changed, &stopped);
    if (!r.ok()) {
      if (o.watch && r.status().code() == Code::kAborted) {
        result.stopped = r.status().message();
        return result;
      }
      ch->abort();
      return r.status();
    }
    ++result.rounds;
    result.files_copied += r->copied.size();
    for (const PulledFile& f : r->copied) result.bytes_copied += f.bytes;
    if (r->tracker) result.tracker = r->tracker;
    if (o.on_round) o.on_round(*r);
    if (stopped) {
      result.stopped = "stop requested";
      ch->close();
      return result;
    }
    if (!o.watch) {
      if (changed && result.rounds < kOnceRounds) continue;
      if (changed) {
        ch->abort();
        return failed_precondition(
            fmt::format("files kept changing on {} over {} rounds: is a "
                        "save running there? Try again",
                        puller.peer(), kOnceRounds));
      }
      (void)send_message(*ch, rp::encode_done());
      ch->close();
      return result;
    }
    const auto until = Clock::now() + o.watch_interval;
    while (Clock::now() < until) {
      if (o.stop && o.stop()) {
        result.stopped = "stop requested";
        ch->close();
        return result;
      }
      (*ctx)->wait(std::min(kPoll, std::chrono::duration_cast<milliseconds>(until - Clock::now())));
      // The server speaks only when asked; reading here sees it close or die at once.
      auto m = ch->try_receive();
      if (!m.ok()) {
        result.stopped = m.status().message();
        return result;
      }
      if (m->has_value()) {
        ch->abort();
        return corruption("replicate: " + puller.peer() + " sent a message nobody asked for");
      }
    }
  }
}

}  // namespace ferry::checkpoint

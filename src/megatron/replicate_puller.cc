// The replicate puller: copies the metadata files a server offers that this folder lacks or
// holds different, checking each path before it writes and each file's XXH3 after. In
// file-set mode (ReplicatePullOptions::only) it fetches the caller's files instead, checked
// against the caller's sizes and XXH3s and streamed to disk as they arrive.
#include <fmt/format.h>
#include <poll.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "base/clock.h"
#include "base/file_util.h"
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
namespace fs = std::filesystem;
namespace rp = replicate;

// How long the puller waits for the server to take a message.
constexpr milliseconds kSendTimeout{60'000};

Status send_message(transport::Channel& ch, const std::vector<std::byte>& m) {
  return ch.send(m, kSendTimeout);
}

// Refuses a path whose folders below `root` include a symbolic link (which could lead
// outside). A clear refusal up front: the writes themselves go through O_NOFOLLOW opens
// (write_beneath, StreamedFile), which is what holds against a link planted later; a link at
// the file's own name is replaced by the rename, never written through.
Status check_no_link_on_the_way(const std::string& root, const std::string& path,
                                const std::string& peer) {
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

// Refuses a path from the server that leaves the folder, is not a metadata file or the
// tracker, or passes through a folder that is a symbolic link.
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
  return check_no_link_on_the_way(root, path, peer);
}

// The tracker of an INDEX may name only a step whose metadata the INDEX offers, all of it: a
// torch_dist folder of that step with common.pt, .metadata and metadata.json, and no folder of
// that step offered with only some of them. Every offered file is in place here, checked
// against its XXH3, before the tracker is written (it goes last), so a tracker this puller
// writes never names a step it did not receive. A server that offers the tracker without
// naming its step, or names a step without offering the tracker, breaks the same rule.
// Corruption naming the server and the step; checked before anything is written.
Status check_tracker_offer(const ReplicaSet& set, const std::string& peer) {
  const bool tracker_offered =
      std::any_of(set.files.begin(), set.files.end(),
                  [](const ReplicaFile& f) { return f.path == kMegatronTracker; });
  if (tracker_offered != set.tracker.has_value()) {
    return corruption(fmt::format(
        "replicate: {} offers {} but {}: refused, nothing written", peer,
        tracker_offered ? std::string(kMegatronTracker) : "no " + std::string(kMegatronTracker),
        tracker_offered ? "names no step for it"
                        : fmt::format("names step {} as its tracker's", *set.tracker)));
  }
  if (!set.tracker) return ok_status();
  const std::int64_t step = *set.tracker;
  // The metadata files offered per torch_dist folder of the tracker's step.
  std::map<std::string, std::set<std::string>> folders;
  for (const ReplicaFile& f : set.files) {
    const std::size_t first = f.path.find('/');
    if (first == std::string::npos) continue;  // the tracker
    if (megatron::parse_megatron_step_folder(std::string_view(f.path).substr(0, first)) != step) {
      continue;
    }
    const std::size_t last = f.path.rfind('/');
    folders[f.path.substr(0, last)].insert(f.path.substr(last + 1));
  }
  const std::set<std::string> all = {std::string(kMegatronCommon),
                                     std::string(kMegatronDcpMetadata),
                                     std::string(kMegatronConfig)};
  for (const auto& [folder, names] : folders) {
    if (names != all) {
      return corruption(fmt::format(
          "replicate: {} offers a tracker naming step {} but only part of that step's metadata "
          "({} of common.pt, .metadata, metadata.json in {}): refused, nothing written",
          peer, step, names.size(), folder));
    }
  }
  if (folders.empty()) {
    return corruption(
        fmt::format("replicate: {} offers a tracker naming step {} but none of that step's "
                    "metadata (common.pt, .metadata, metadata.json of its torch_dist folders): "
                    "refused, nothing written",
                    peer, step));
  }
  return ok_status();
}

class Puller {
 public:
  Puller(const ReplicatePullOptions& o, transport::Channel& ch) : o_(o), ch_(ch) {}

  // One LIST and the GETs it calls for. `changed` when the server said a file changed
  // under it (that file and the ones after it wait for the next round).
  Result<PullRound> round(int number, bool* changed, bool* stopped) {
    PullRound out;
    out.round = number;
    auto set = list();
    if (!set.ok()) return set.status();
    // Everything is checked before anything is written.
    for (const ReplicaFile& f : set->files) {
      FERRY_RETURN_IF_ERROR(check_offered_path(o_.root, f.path, peer()));
    }
    FERRY_RETURN_IF_ERROR(check_tracker_offer(*set, peer()));
    std::stable_partition(set->files.begin(), set->files.end(),
                          [](const ReplicaFile& f) { return f.path != kMegatronTracker; });
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
      std::string held_back;
      auto got = fetch(f, set->tracker, &held_back);
      if (!got.ok()) return got.status();
      if (!*got) {
        *changed = true;
        out.notes.push_back(held_back);
        last_held_back_ = held_back;
        return out;
      }
      out.copied.push_back({f.path, f.bytes});
    }
    // Every offered file, the tracker last, is in place and checked.
    out.tracker = set->tracker;
    return out;
  }

  // File-set mode: one LIST, then a GET for each file of `only` this folder does not hold
  // already. Sizes and XXH3s are the caller's: the INDEX must offer every file with them
  // (checked for all before anything is fetched), and the bytes that arrive must hash to them.
  Result<PullRound> fetch_set(bool* stopped) {
    PullRound out;
    out.round = 1;
    const std::string server = "server " + o_.from;
    auto set = list();
    if (!set.ok()) return set.status();
    std::map<std::string_view, const ReplicaFile*> offered;
    for (const ReplicaFile& f : set->files) offered.emplace(f.path, &f);
    for (const ReplicaFile& want : o_.only) {
      const auto it = offered.find(want.path);
      if (it == offered.end()) {
        return not_found(fmt::format("replicate: {} does not offer {} (it offers {} files)", server,
                                     want.path, set->files.size()));
      }
      const ReplicaFile& f = *it->second;
      if (f.bytes != want.bytes || f.xxh3 != want.xxh3) {
        return corruption(fmt::format(
            "replicate: {} offers {} with {} bytes, xxh3 {:016x}, but the caller expects {} "
            "bytes, xxh3 {:016x}: refused",
            server, want.path, f.bytes, f.xxh3, want.bytes, want.xxh3));
      }
      FERRY_RETURN_IF_ERROR(check_no_link_on_the_way(o_.root, want.path, server));
    }
    out.notes = set->notes;
    std::vector<const ReplicaFile*> need;
    for (const ReplicaFile& want : o_.only) {
      auto held = holds(want);
      if (!held.ok()) return held.status();
      if (*held) {
        ++out.unchanged;
      } else {
        need.push_back(&want);
      }
    }
    done_ = total_ = 0;
    for (const ReplicaFile* f : need) total_ += f->bytes;
    for (const ReplicaFile* f : need) {
      if (o_.stop && o_.stop()) {
        *stopped = true;
        return out;
      }
      FERRY_RETURN_IF_ERROR(fetch_streamed(*f));
      out.copied.push_back({f->path, f->bytes});
    }
    return out;
  }

  const std::string& peer() const { return ch_.peer(); }
  // Why the last round held a file back (the note it added), for the error of a pull that
  // gives up.
  const std::string& last_held_back() const { return last_held_back_; }

 private:
  // LIST, and the INDEX that answers it.
  Result<ReplicaSet> list() {
    FERRY_RETURN_IF_ERROR(send_message(ch_, rp::encode_list()));
    auto m = receive("INDEX");
    if (!m.ok()) return m.status();
    auto kind = rp::decode_kind(*m, peer());
    if (!kind.ok()) return kind.status();
    if (*kind == rp::Kind::kError) return server_error(*m, "listing");
    if (*kind != rp::Kind::kIndex)
      return corruption("replicate: " + peer() + " answered LIST out of order");
    return rp::decode_index(*m, peer());
  }

  // Whether this folder holds `f` already with the caller's size and XXH3: opened without
  // following links, hashed in big reads, and only when the size matches.
  Result<bool> holds(const ReplicaFile& f) {
    std::error_code ec;
    if (!fs::exists(o_.root, ec)) return false;
    auto root = megatron::open_root(o_.root);
    if (!root.ok()) return root.status();
    struct stat st {};
    auto fd = megatron::open_file_beneath(root->get(), o_.root, f.path, &st);
    if (!fd.ok()) {
      // Missing, or a link or non-file where it goes (replaced by the rename, never followed).
      const Code c = fd.status().code();
      if (c == Code::kNotFound || c == Code::kFailedPrecondition) return false;
      return fd.status();
    }
    if (static_cast<std::uint64_t>(st.st_size) != f.bytes) return false;
    std::uint64_t bytes = 0;
    auto sum = rp::xxh3_fd(fd->get(), o_.root + "/" + f.path, &bytes);
    if (!sum.ok()) return sum.status();
    return bytes == f.bytes && *sum == f.xxh3;
  }

  // One file of the set, written to a temp file as its chunks arrive and hashed as they are
  // written (a shard of many GB is never whole in memory); renamed over the target only when
  // whole and equal to the caller's XXH3, removed otherwise.
  Status fetch_streamed(const ReplicaFile& f) {
    const std::string server = "server " + o_.from;
    FERRY_RETURN_IF_ERROR(send_message(ch_, rp::encode_get(f)));
    auto m = receive(f.path);
    if (!m.ok()) return m.status();
    auto kind = rp::decode_kind(*m, peer());
    if (!kind.ok()) return kind.status();
    if (*kind == rp::Kind::kError) return set_error(*m, f);
    if (*kind != rp::Kind::kFile)
      return corruption(fmt::format("replicate: {} answered GET {} out of order", server, f.path));
    auto head = rp::decode_file(*m, peer());
    if (!head.ok()) return head.status();
    if (head->path != f.path || head->bytes != f.bytes || head->xxh3 != f.xxh3) {
      return corruption(fmt::format(
          "replicate: {} sent '{}' ({} bytes, xxh3 {:016x}) when asked for '{}' ({} bytes, xxh3 "
          "{:016x})",
          server, head->path, head->bytes, head->xxh3, f.path, f.bytes, f.xxh3));
    }
    auto out = rp::StreamedFile::create(o_.root, f.path);
    if (!out.ok()) return out.status().with_context("replicate: writing " + f.path);
    std::uint64_t received = 0;
    while (received < f.bytes) {
      auto c = receive("CHUNK");
      if (!c.ok()) {
        return c.status().with_context(
            fmt::format("{} from {} at byte {} of {}", f.path, server, received, f.bytes));
      }
      auto k = rp::decode_kind(*c, peer());
      if (!k.ok()) return k.status();
      if (*k == rp::Kind::kError) return set_error(*c, f);
      if (*k != rp::Kind::kChunk)
        return corruption(fmt::format("replicate: {} interrupted {}", server, f.path));
      auto chunk = rp::decode_chunk(*c, peer());
      if (!chunk.ok()) return chunk.status();
      if (chunk->offset != received || chunk->data.size() > f.bytes - received ||
          chunk->data.empty()) {
        return corruption(
            fmt::format("replicate: {} sent bytes [{}, +{}) of {} out of order or past its {} "
                        "bytes",
                        server, chunk->offset, chunk->data.size(), f.path, f.bytes));
      }
      if (Status s = out->append(chunk->data); !s.ok())
        return s.with_context("replicate: writing " + f.path);
      received += chunk->data.size();
      done_ += chunk->data.size();
      if (o_.progress) o_.progress(done_, total_);
    }
    if (const std::uint64_t got = out->xxh3(); got != f.xxh3) {
      return corruption(
          fmt::format("replicate: {} from {} has XXH3 {:016x}, not the {:016x} the caller "
                      "expects; discarded",
                      f.path, server, got, f.xxh3));
    }
    if (Status s = out->commit(); !s.ok()) return s.with_context("replicate: writing " + f.path);
    return ok_status();
  }

  // An ERROR answering a GET of the set. "changed" is not waited out as in a Megatron pull:
  // the caller's XXH3 is fixed, so a server whose file no longer has it cannot give it.
  Status set_error(std::span<const std::byte> m, const ReplicaFile& f) {
    auto e = rp::decode_error(m, peer());
    if (!e.ok()) return e.status();
    const std::string server = "server " + o_.from;
    if (e->code == rp::ErrorCode::kChanged) {
      return corruption(
          fmt::format("replicate: {} no longer has {} as it offered it and the caller expects "
                      "it ({} bytes, xxh3 {:016x}): {}",
                      server, f.path, f.bytes, f.xxh3, e->message));
    }
    const std::string message =
        fmt::format("replicate: {} failed sending {}: {}", server, f.path, e->message);
    return e->code == rp::ErrorCode::kIo ? io_error(message) : failed_precondition(message);
  }

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

  // Copies one file; false, with the reason in `held_back`, when it waits for the next round:
  // the server reported it changed, or (the tracker) the bytes it sent name another step than
  // the one whose metadata the INDEX offered (a tracker that moved on between the server's
  // scan and its hash; or a hostile server): that tracker is not written.
  Result<bool> fetch(const ReplicaFile& f, std::optional<std::int64_t> tracker_step,
                     std::string* held_back) {
    FERRY_RETURN_IF_ERROR(send_message(ch_, rp::encode_get(f)));
    auto m = receive(f.path);
    if (!m.ok()) return m.status();
    auto kind = rp::decode_kind(*m, peer());
    if (!kind.ok()) return kind.status();
    if (*kind == rp::Kind::kError) {
      auto e = rp::decode_error(*m, peer());
      if (!e.ok()) return e.status();
      if (e->code == rp::ErrorCode::kChanged) {
        *held_back = f.path +
                     " changed on the server while being copied; it waits for the "
                     "next round";
        return false;
      }
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
    auto hash = rp::new_xxh3_state();
    if (!hash.ok()) return hash.status();
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
      XXH3_64bits_update(hash->get(), chunk->data.data(), chunk->data.size());
      received += chunk->data.size();
      done_ += chunk->data.size();
      if (o_.progress) o_.progress(done_, total_);
    }
    if (const std::uint64_t got = XXH3_64bits_digest(hash->get()); got != f.xxh3) {
      return corruption(
          fmt::format("replicate: {} from {} has XXH3 {:016x}, not the {:016x} it "
                      "was offered with; discarded",
                      f.path, peer(), got, f.xxh3));
    }
    if (f.path == kMegatronTracker) {
      // check_tracker_offer() saw the INDEX name a step for it, and that step's metadata.
      const std::string_view text(reinterpret_cast<const char*>(content.data()), content.size());
      auto step = megatron::parse_tracker(text);
      if (!step.ok() || !tracker_step || *step != *tracker_step) {
        *held_back = fmt::format(
            "{} from {} {}, not step {} whose metadata it offered: not written; it waits for "
            "the next round",
            f.path, peer(),
            step.ok() ? fmt::format("names step {}", *step) : step.status().message(),
            tracker_step.value_or(-1));
        return false;
      }
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
  transport::Channel& ch_;
  megatron::FileHashes hashes_;
  std::string last_held_back_;
  std::uint64_t done_ = 0, total_ = 0;  // bytes of this round's copies, for `progress`
};

}  // namespace

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
  if (!o.only.empty()) {
    if (o.watch) return invalid_argument("a watch cannot fetch a fixed set of files (only)");
    std::set<std::string_view> seen;
    for (const ReplicaFile& f : o.only) {
      FERRY_RETURN_IF_ERROR(validate_relative_path(f.path, "file to fetch"));
      if (!seen.insert(f.path).second)
        return invalid_argument("file to fetch '" + f.path + "' is listed twice");
    }
  }
  transport::Registry transports({.secret_file = o.token_file});
  // Errors and the channel name the server "replicate server at <address>".
  auto connected = transports.connect(o.from, o.timeout, "replicate server");
  if (!connected.ok()) return connected.status();
  const std::unique_ptr<transport::Channel>& ch = *connected;
  Puller puller(o, *ch);
  const auto poller = ch->poller();
  PullResult result;
  // A one-shot pull lists again when a file changed under the server, a few times.
  constexpr int kOnceRounds = 3;
  while (true) {
    bool changed = false, stopped = false;
    auto r = o.only.empty() ? puller.round(result.rounds + 1, &changed, &stopped)
                            : puller.fetch_set(&stopped);
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
        // Said before the abort, which leaves the channel without its peer's name.
        Status gave_up = failed_precondition(
            fmt::format("files kept changing on {} over {} rounds (the last: {}): is a "
                        "save running there? Try again",
                        puller.peer(), kOnceRounds, puller.last_held_back()));
        ch->abort();
        return gave_up;
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
      std::vector<pollfd> fds{{ch->poll_fd(), POLLIN, 0}};
      const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
      (void)poller->wait(fds, std::clamp(left, milliseconds(0), rp::kPollInterval));
      poller->progress();
      // The server speaks only when asked; reading here sees it close or die at once.
      auto m = rp::receive_now(*ch);
      if (!m.ok()) {
        result.stopped = m.status().message();
        return result;
      }
      if (m->has_value()) {
        Status unasked =
            corruption("replicate: " + puller.peer() + " sent a message nobody asked for");
        ch->abort();
        return unasked;
      }
    }
  }
}

}  // namespace ferry::checkpoint

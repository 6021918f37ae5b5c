// verl / Megatron checkpoint folders: scanning, what a node offers for replication, and
// verify across node folders. docs/checkpoint.md cites the verl and Megatron sources this
// layout and the completeness rule come from.
#include "megatron/megatron_dist_checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/env.h"
#include "base/file_util.h"
#include "base/parse_number.h"
#include "base/status_macros.h"

namespace ferry::checkpoint {
namespace fs = std::filesystem;

namespace megatron {
namespace {

// A step folder's torch_dist folders lie a few levels down (actor/dist_ckpt,
// actor/model/dist_ckpt); a deeper walk would only find what verl never writes.
constexpr int kMaxWalkDepth = 6;
constexpr std::array<std::string_view, 3> kMetadataNames = {kMegatronCommon, kMegatronDcpMetadata,
                                                            kMegatronConfig};

bool is_metadata_name(std::string_view name) {
  return std::find(kMetadataNames.begin(), kMetadataNames.end(), name) != kMetadataNames.end();
}
bool is_shard_name(std::string_view name) {
  return name.size() > 7 && name.substr(name.size() - 7) == ".distcp";
}

// Megatron's CheckpointingConfig as json.dump writes it: an object with "sharded_backend".
std::string check_config(const std::string& path) {
  auto text = read_file(path);
  if (!text.ok()) return text.status().message();
  if (text->empty()) return "is empty";
  const auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "is not valid JSON (a torn or foreign write?)";
  if (!j.is_object() || !j.contains("sharded_backend") || !j["sharded_backend"].is_string()) {
    return "is not Megatron's metadata.json: no \"sharded_backend\" string";
  }
  return {};
}

// Adds every torch_dist folder at or below `rel` (relative to `root`) to `out`.
void walk(const std::string& root, const std::string& rel, int depth,
          std::vector<DistCheckpointFolder>& out) {
  std::error_code ec;
  DistCheckpointFolder d;
  d.path = rel;
  std::vector<std::string> subdirs;
  for (const auto& e : fs::directory_iterator(root + "/" + rel, ec)) {
    const std::string name = e.path().filename().string();
    const fs::file_status st = e.symlink_status(ec);
    if (fs::is_directory(st)) {
      subdirs.push_back(name);
      continue;
    }
    if (!fs::is_regular_file(st)) continue;  // links and sockets are not Megatron's
    if (is_shard_name(name)) {
      d.shards.push_back(name);
      continue;
    }
    if (!is_metadata_name(name)) continue;
    const std::string full = root + "/" + rel + "/" + name;
    if (name == kMegatronCommon) d.common_pt = true;
    if (name == kMegatronDcpMetadata) d.dcp_metadata = true;
    std::string problem;
    if (name == kMegatronConfig) {
      d.config = true;
      problem = check_config(full);
    } else if (e.file_size(ec) == 0) {
      problem = "is empty";
    }
    if (!problem.empty()) d.problems.emplace_back(name, problem);
  }
  if (d.common_pt || d.dcp_metadata || d.config || !d.shards.empty()) {
    std::sort(d.shards.begin(), d.shards.end());
    out.push_back(std::move(d));
  }
  if (depth >= kMaxWalkDepth) return;
  std::sort(subdirs.begin(), subdirs.end());
  for (const std::string& s : subdirs) walk(root, rel + "/" + s, depth + 1, out);
}

std::string describe_incomplete(const MegatronStep& s) {
  if (s.dist_folders.empty()) return s.folder + " holds no torch_dist folder";
  for (const DistCheckpointFolder& d : s.dist_folders) {
    if (!d.problems.empty()) return d.path + "/" + d.problems[0].first + " " + d.problems[0].second;
    const auto m = d.missing();
    if (!m.empty()) return d.path + " has no " + m[0];
  }
  return s.folder + " is complete";
}

std::string node_name(const std::string& root) {
  fs::path p = fs::path(root).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().empty() ? root : p.filename().string();
}

std::string hex(std::uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace

std::optional<std::int64_t> parse_megatron_step_folder(std::string_view name) {
  for (std::string_view prefix : {std::string_view("global_step_"), std::string_view("iter_")}) {
    if (name.substr(0, prefix.size()) == prefix) return parse_uint(name.substr(prefix.size()));
  }
  return std::nullopt;
}

Result<std::int64_t> parse_tracker(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return invalid_argument("is empty (is it being written?)");
  text = text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
  if (text == "release") {
    return invalid_argument("names 'release' (a Megatron-LM release checkpoint), not a step");
  }
  if (auto v = parse_uint(text)) return *v;
  return invalid_argument("does not hold a step number: '" + std::string(text.substr(0, 40)) + "'");
}

bool is_replica_path(std::string_view path) {
  if (path == kMegatronTracker) return true;
  std::vector<std::string_view> parts;
  for (std::size_t start = 0; start <= path.size();) {
    std::size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    parts.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return parts.size() >= 2 && parts.size() <= 8 && parse_megatron_step_folder(parts.front()) &&
         is_metadata_name(parts.back());
}

namespace {

std::vector<std::string_view> components(std::string_view rel) {
  std::vector<std::string_view> out;
  for (std::size_t start = 0; start <= rel.size();) {
    std::size_t end = rel.find('/', start);
    if (end == std::string_view::npos) end = rel.size();
    if (end > start) out.push_back(rel.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// ELOOP (O_NOFOLLOW met a link) and ENOTDIR (O_DIRECTORY met a link or a file) as one
// named refusal; other errors as errno_status.
Status open_error(const std::string& root, std::string_view rel, std::string_view at, int err) {
  if (err == ELOOP || err == ENOTDIR) {
    return failed_precondition(
        fmt::format("{}/{}: {} is a symbolic link or not a folder: not "
                    "followed",
                    root, rel, at));
  }
  return errno_status("openat", fmt::format("{}/{}", root, rel), err);
}

}  // namespace

Result<ScopedFd> open_root(const std::string& root) {
  ScopedFd fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("open", root, errno);
  return fd;
}

Result<ScopedFd> open_parent_beneath(int root_fd, const std::string& root, std::string_view rel,
                                     bool create) {
  const auto parts = components(rel);
  ScopedFd dir(::fcntl(root_fd, F_DUPFD_CLOEXEC, 0));
  if (!dir.valid()) return errno_status("dup", root, errno);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    const std::string name(parts[i]);
    if (name == "." || name == "..")
      return invalid_argument(root + "/" + std::string(rel) + ": '.' or '..' in the path");
    if (create && ::mkdirat(dir.get(), name.c_str(), 0755) != 0 && errno != EEXIST) {
      return errno_status("mkdirat", fmt::format("{}/{}", root, rel), errno);
    }
    ScopedFd next(
        ::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) return open_error(root, rel, name, errno);
    dir = std::move(next);
  }
  return dir;
}

Result<ScopedFd> open_file_beneath(int root_fd, const std::string& root, std::string_view rel,
                                   struct stat* st) {
  const auto parts = components(rel);
  if (parts.empty()) return invalid_argument(root + ": an empty path to read");
  auto dir = open_parent_beneath(root_fd, root, rel, /*create=*/false);
  if (!dir.ok()) return dir.status();
  const std::string name(parts.back());
  // O_NONBLOCK: a FIFO swapped in must not hang the open; fstat below refuses it.
  ScopedFd fd(::openat(dir->get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return open_error(root, rel, name, errno);
  const std::string full = fmt::format("{}/{}", root, rel);
  if (::fstat(fd.get(), st) != 0) return errno_status("fstat", full, errno);
  if (!S_ISREG(st->st_mode)) return failed_precondition(full + " is not a regular file");
  return fd;
}

Result<std::string> read_open_file(int fd, const struct stat& st, const std::string& what) {
  std::string out;
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t have = 0;
  while (true) {
    if (have == out.size()) out.resize(out.size() + 4096);  // grew meanwhile: read to the end
    const ssize_t n = ::read(fd, out.data() + have, out.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("read", what, errno);
    if (n == 0) break;
    have += static_cast<std::size_t>(n);
  }
  out.resize(have);
  return out;
}

Result<std::string> read_beneath(int root_fd, const std::string& root, std::string_view rel,
                                 struct stat* st) {
  auto fd = open_file_beneath(root_fd, root, rel, st);
  if (!fd.ok()) return fd.status();
  return read_open_file(fd->get(), *st, fmt::format("{}/{}", root, rel));
}

Status write_beneath(int root_fd, const std::string& root, std::string_view rel,
                     std::span<const std::byte> data) {
  const auto parts = components(rel);
  if (parts.empty()) return invalid_argument(root + ": an empty path to write");
  auto dir = open_parent_beneath(root_fd, root, rel, /*create=*/true);
  if (!dir.ok()) return dir.status();
  const std::string name(parts.back());
  const std::string full = fmt::format("{}/{}", root, rel);
  static std::atomic<unsigned> counter{0};
  const std::string tmp = fmt::format(".{}.tmp.{}.{}", name, ::getpid(), counter++);
  ScopedFd fd(::openat(dir->get(), tmp.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return open_error(root, rel, tmp, errno);
  Env& env = Env::current();
  Status s = env.write(fd.get(), data, full);
  if (s.ok()) s = env.sync(fd.get(), full);
  if (s.ok() && ::renameat(dir->get(), tmp.c_str(), dir->get(), name.c_str()) != 0) {
    s = errno_status("renameat", full, errno);
  }
  if (!s.ok()) {
    (void)::unlinkat(dir->get(), tmp.c_str(), 0);
    return s;
  }
  (void)::fsync(dir->get());
  return ok_status();
}

Result<FileHashes::Entry> FileHashes::get(const std::string& root, const std::string& rel) {
  auto root_fd = open_root(root);
  if (!root_fd.ok()) return root_fd.status();
  // The key and the bytes come from one fd opened without following links.
  struct stat st {};
  auto fd = open_file_beneath(root_fd->get(), root, rel, &st);
  if (!fd.ok()) return fd.status();
  const std::string path = root + "/" + rel;
  const Key key{static_cast<std::uint64_t>(st.st_size), static_cast<std::uint64_t>(st.st_ino),
                st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec,
                st.st_ctim.tv_sec * 1'000'000'000LL + st.st_ctim.tv_nsec};
  if (auto it = cache_.find(path); it != cache_.end() && it->second.first == key) {
    return it->second.second;
  }
  auto bytes = read_open_file(fd->get(), st, path);
  if (!bytes.ok()) return bytes.status();
  const Entry e{bytes->size(), XXH3_64bits(bytes->data(), bytes->size())};
  cache_[path] = {key, e};
  return e;
}

Result<ReplicaSet> replica_set(const std::string& root, FileHashes& hashes) {
  auto folder = scan_megatron_folder(root);
  if (!folder.ok()) return folder.status();
  ReplicaSet out;
  const std::string tracker_name(kMegatronTracker);
  if (!folder->tracker_present) {
    out.notes.push_back(fmt::format(
        "no {} in {}: verl writes it once a save has completed; nothing is offered until then",
        tracker_name, root));
    return out;
  }
  if (!folder->tracker) {
    out.notes.push_back(fmt::format("{} {}; nothing is offered until it names a step", tracker_name,
                                    folder->tracker_problem));
    return out;
  }
  const std::int64_t tracker = *folder->tracker;
  bool tracker_step_offered = false;
  for (const MegatronStep& s : folder->steps) {
    if (s.step > tracker) {
      out.notes.push_back(
          fmt::format("step {} is newer than the tracker's step {} (a save in progress): held back",
                      s.step, tracker));
      continue;
    }
    if (!s.complete()) {
      out.notes.push_back(
          fmt::format("step {} is incomplete ({}): held back", s.step, describe_incomplete(s)));
      continue;
    }
    std::vector<ReplicaFile> files;
    Status gone;
    for (const DistCheckpointFolder& d : s.dist_folders) {
      for (std::string_view name : kMetadataNames) {
        ReplicaFile f{d.path + "/" + std::string(name), 0, 0};
        auto h = hashes.get(root, f.path);
        if (!h.ok()) {
          // Removed since the scan (verl's max_ckpt_to_keep), or swapped for a link or a
          // non-file (never followed): the step waits.
          const Code c = h.status().code();
          if (c != Code::kNotFound && c != Code::kFailedPrecondition) return h.status();
          gone = h.status();
          break;
        }
        f.bytes = h->bytes;
        f.xxh3 = h->xxh3;
        files.push_back(std::move(f));
      }
    }
    if (!gone.ok()) {
      out.notes.push_back(
          fmt::format("step {} changed while read ({}): held back", s.step, gone.message()));
      continue;
    }
    out.files.insert(out.files.end(), files.begin(), files.end());
    if (s.step == tracker) tracker_step_offered = true;
  }
  if (!tracker_step_offered) {
    const MegatronStep* s = folder->find(tracker);
    out.notes.push_back(
        s == nullptr
            ? fmt::format("{} names step {}, which has no folder here: the tracker is held back",
                          tracker_name, tracker)
            : fmt::format("{} names step {}, which is not complete: the tracker is held back",
                          tracker_name, tracker));
    return out;
  }
  auto h = hashes.get(root, tracker_name);
  if (!h.ok()) return h.status();
  out.files.push_back({tracker_name, h->bytes, h->xxh3});
  out.tracker = tracker;
  return out;
}

}  // namespace megatron

// ---------------------------------------------------------------------------

std::vector<std::string> DistCheckpointFolder::missing() const {
  std::vector<std::string> out;
  if (!common_pt) out.emplace_back(kMegatronCommon);
  if (!dcp_metadata) out.emplace_back(kMegatronDcpMetadata);
  if (!config) out.emplace_back(kMegatronConfig);
  return out;
}

bool MegatronStep::complete() const {
  return !dist_folders.empty() &&
         std::all_of(dist_folders.begin(), dist_folders.end(),
                     [](const DistCheckpointFolder& d) { return d.complete(); });
}

const MegatronStep* MegatronFolder::find(std::int64_t step) const {
  for (const MegatronStep& s : steps) {
    if (s.step == step) return &s;
  }
  return nullptr;
}

bool MegatronVerifyReport::ok() const {
  return std::all_of(nodes.begin(), nodes.end(),
                     [](const MegatronNodeReport& n) { return n.ok(); });
}

bool is_megatron_folder(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir + "/" + std::string(kMegatronTracker), ec))) return true;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (fs::is_directory(e.symlink_status(ec)) &&
        megatron::parse_megatron_step_folder(e.path().filename().string())) {
      return true;
    }
  }
  return false;
}

std::vector<std::string> expand_megatron_roots(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  bool any = false;
  for (const std::string& a : args) {
    if (is_megatron_folder(a)) {
      out.push_back(a);
      any = true;
      continue;
    }
    std::vector<std::string> inner;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(a, ec)) {
      if (fs::is_directory(e.symlink_status(ec)) && is_megatron_folder(e.path().string())) {
        inner.push_back(e.path().string());
      }
    }
    std::sort(inner.begin(), inner.end());
    any |= !inner.empty();
    if (inner.empty()) out.push_back(a);  // a node folder with nothing yet: all of it is missing
    out.insert(out.end(), inner.begin(), inner.end());
  }
  return any ? out : std::vector<std::string>{};
}

Result<MegatronFolder> scan_megatron_folder(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return not_found("checkpoint folder " + root + " is not a folder");
  MegatronFolder f;
  f.root = root;
  const std::string tracker = root + "/" + std::string(kMegatronTracker);
  const fs::file_status ts = fs::symlink_status(tracker, ec);
  if (fs::exists(ts)) {
    f.tracker_present = true;
    if (!fs::is_regular_file(ts)) {
      f.tracker_problem = "is not a regular file";
    } else if (auto text = read_file(tracker); !text.ok()) {
      f.tracker_problem = "cannot be read: " + text.status().message();
    } else if (auto step = megatron::parse_tracker(*text); !step.ok()) {
      f.tracker_problem = step.status().message();
    } else {
      f.tracker = *step;
    }
  }
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const auto step = megatron::parse_megatron_step_folder(name);
    std::error_code entry_ec;  // an entry removed meanwhile is simply not a step
    if (!step || !fs::is_directory(e.symlink_status(entry_ec))) continue;
    MegatronStep s;
    s.step = *step;
    s.folder = name;
    megatron::walk(root, name, 1, s.dist_folders);
    f.steps.push_back(std::move(s));
  }
  if (ec) return errno_status("opendir", root, ec.value());
  std::sort(f.steps.begin(), f.steps.end(), [](const MegatronStep& a, const MegatronStep& b) {
    return a.step != b.step ? a.step < b.step : a.folder < b.folder;
  });
  return f;
}

Result<ReplicaSet> replica_set(const std::string& root) {
  megatron::FileHashes hashes;
  return megatron::replica_set(root, hashes);
}

// ---------------------------------------------------------------------------
// verify

namespace {

struct RootState {
  MegatronFolder folder;
  MegatronNodeReport report;
};

const DistCheckpointFolder* find_dist(const MegatronFolder& f, std::int64_t step,
                                      const std::string& path) {
  const MegatronStep* s = f.find(step);
  if (s == nullptr) return nullptr;
  for (const DistCheckpointFolder& d : s->dist_folders) {
    if (d.path == path) return &d;
  }
  return nullptr;
}

bool has_file(const DistCheckpointFolder& d, std::string_view name) {
  return name == kMegatronCommon        ? d.common_pt
         : name == kMegatronDcpMetadata ? d.dcp_metadata
                                        : d.config;
}

// Checks one torch_dist folder of one step on every root: presence, usability, and that
// the copies agree with the one on the node that holds rank 0's shards (rank 0 wrote them).
Status check_dist_folder(std::vector<RootState>& roots, std::int64_t step, const std::string& path,
                         megatron::FileHashes& hashes, std::vector<std::string>& notes) {
  std::optional<std::size_t> rank0;
  for (std::size_t r = 0; r < roots.size(); ++r) {
    const DistCheckpointFolder* d = find_dist(roots[r].folder, step, path);
    if (d == nullptr) continue;
    if (d->shards.empty()) {
      notes.push_back(fmt::format("{} holds no shard files in {}", roots[r].report.node, path));
    }
    for (const std::string& s : d->shards) {
      if (s.rfind("__0_", 0) == 0 && !rank0) rank0 = r;
    }
  }
  for (std::string_view name : megatron::kMetadataNames) {
    const std::string rel = path + "/" + std::string(name);
    std::vector<std::pair<std::size_t, megatron::FileHashes::Entry>> copies;
    for (std::size_t r = 0; r < roots.size(); ++r) {
      const DistCheckpointFolder* d = find_dist(roots[r].folder, step, path);
      if (d == nullptr || !has_file(*d, name)) {
        roots[r].report.missing.push_back(rel);
        continue;
      }
      const auto bad = std::find_if(d->problems.begin(), d->problems.end(),
                                    [&](const auto& p) { return p.first == name; });
      if (bad != d->problems.end()) {
        roots[r].report.inconsistent.push_back({rel, std::string(name) + " " + bad->second});
        continue;
      }
      auto h = hashes.get(roots[r].folder.root, rel);
      if (!h.ok()) return h.status();
      copies.emplace_back(r, *h);
    }
    if (copies.size() < 2) continue;
    auto ref = copies.begin();
    for (auto it = copies.begin(); it != copies.end(); ++it) {
      if (rank0 && it->first == *rank0) ref = it;
    }
    for (const auto& [r, e] : copies) {
      if (e.xxh3 == ref->second.xxh3 && e.bytes == ref->second.bytes) continue;
      roots[r].report.inconsistent.push_back(
          {rel, fmt::format("{} differs from the copy on {} ({} bytes, xxh3 {}; here {} bytes, "
                            "xxh3 {})",
                            name, roots[ref->first].report.node, ref->second.bytes,
                            megatron::hex(ref->second.xxh3), e.bytes, megatron::hex(e.xxh3))});
    }
  }
  return ok_status();
}

}  // namespace

Result<MegatronVerifyReport> verify_megatron(const std::vector<std::string>& roots,
                                             std::optional<std::int64_t> step) {
  if (roots.empty()) return invalid_argument("no checkpoint folder given");
  std::vector<RootState> state;
  for (const std::string& root : roots) {
    auto f = scan_megatron_folder(root);
    if (!f.ok()) return f.status();
    RootState s;
    s.report.root = root;
    s.report.node = megatron::node_name(root);
    s.folder = std::move(*f);
    state.push_back(std::move(s));
  }
  MegatronVerifyReport report;
  // Every step folder any node has, with whether it is complete on some node and one
  // explanation of why not.
  std::map<std::int64_t, std::pair<bool, std::string>> steps;
  // Steps with shards on some node given but rank 0's on none: rank 0's node, the only one
  // that writes the metadata without shared storage, is not among the folders.
  std::map<std::int64_t, bool> has_rank0, has_shards;
  for (const RootState& s : state) {
    for (const MegatronStep& st : s.folder.steps) {
      if (step && st.step != *step) continue;
      auto& [complete, why] = steps[st.step];
      complete |= st.complete();
      if (!st.complete() && why.empty()) why = megatron::describe_incomplete(st);
      for (const DistCheckpointFolder& d : st.dist_folders) {
        has_shards[st.step] |= !d.shards.empty();
        for (const std::string& sh : d.shards) has_rank0[st.step] |= sh.rfind("__0_", 0) == 0;
      }
    }
    if (s.folder.tracker && (!report.tracker || *s.folder.tracker > *report.tracker)) {
      report.tracker = s.folder.tracker;
    }
  }
  if (step && steps.empty()) {
    return not_found(
        fmt::format("step {} is in none of the {} folder(s) given", *step, roots.size()));
  }
  megatron::FileHashes hashes;
  std::vector<std::int64_t> without_rank0;
  for (const auto& [s, info] : steps) {
    if (!info.first && has_shards[s] && !has_rank0[s]) {
      // Not a save in progress (rank 0's shards would be here): these nodes lack what rank
      // 0's node wrote, which verl needs on every node to load.
      without_rank0.push_back(s);
    } else if (!info.first) {
      report.notes.push_back(fmt::format(
          "step {} is incomplete on every node given ({}): a save in progress or one that "
          "failed; not checked",
          s, info.second));
      continue;
    }
    report.steps.push_back(s);
    std::set<std::string> paths;
    for (const RootState& r : state) {
      if (const MegatronStep* st = r.folder.find(s)) {
        for (const DistCheckpointFolder& d : st->dist_folders) paths.insert(d.path);
      }
    }
    for (const std::string& p : paths) {
      FERRY_RETURN_IF_ERROR(check_dist_folder(state, s, p, hashes, report.notes));
    }
  }
  if (!without_rank0.empty()) {
    report.notes.push_back(fmt::format(
        "step(s) {}: no folder given holds rank 0's shards (__0_*.distcp), so rank 0's node, "
        "the only one that writes common.pt, .metadata, metadata.json and {} without shared "
        "storage, is not among them; verl cannot load on a node without them",
        fmt::join(without_rank0, ", "), kMegatronTracker));
  }
  const std::string tracker(kMegatronTracker);
  std::string ahead_node;
  for (const RootState& r : state) {
    if (r.folder.tracker == report.tracker) ahead_node = r.report.node;
  }
  for (RootState& r : state) {
    const MegatronFolder& f = r.folder;
    auto& bad = r.report.inconsistent;
    if (!f.tracker_present) {
      if (!report.steps.empty()) r.report.missing.insert(r.report.missing.begin(), tracker);
      continue;
    }
    if (!f.tracker) {
      bad.push_back({tracker, tracker + " " + f.tracker_problem});
      continue;
    }
    const std::int64_t t = *f.tracker;
    if (t < *report.tracker) {
      bad.push_back({tracker, fmt::format("{} names step {}, but {} names step {}", tracker, t,
                                          ahead_node, *report.tracker)});
    }
    if (f.find(t) == nullptr) {
      bad.push_back(
          {tracker, fmt::format("{} names step {}, which has no folder here", tracker, t)});
    } else if (auto it = steps.find(t); it != steps.end() && !it->second.first) {
      bad.push_back({tracker, fmt::format("{} names step {}, which is incomplete on every node "
                                          "given ({})",
                                          tracker, t, it->second.second)});
    }
  }
  for (RootState& r : state) {
    if (!r.report.ok() && !without_rank0.empty()) {
      r.report.fix = fmt::format(
          "copy the metadata from rank 0's node: there `ferry ckpt replicate DIR --serve "
          "0.0.0.0:PORT`, here `ferry ckpt replicate {} --from NODE0:PORT`; or verify every "
          "node's folder together to see what each lacks",
          r.report.root);
    }
    report.nodes.push_back(std::move(r.report));
  }
  return report;
}

}  // namespace ferry::checkpoint

// `ferry ckpt save|load` in one process: ranks are threads of a local group,
// nodes are folders. Saving splits every tensor of a Hugging Face folder along
// dim 0; loading reassembles whole tensors into one model.safetensors.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/atomic_file.h"
#include "base/env.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/parse_number.h"
#include "base/random.h"
#include "base/status_macros.h"
#include "checkpoint/format.h"
#include "ferry/checkpoint.h"
#include "ferry/checkpoint_tools.h"
#include "ferry/safetensors.h"
#include "rank_group/rank_group.h"

namespace ferry::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool is_root(const std::string& dir) {
  return !format::list_step_folders(dir).empty() ||
         format::file_exists(dir + "/" + std::string(format::kLatestFile));
}

std::string group_address() {
  return "@ferry-ckpt-cli-" + std::to_string(::getpid()) + "-" + std::to_string(random_u64());
}

// The error the ranks' threads report: the first, unless a rank's own error comes after
// the "rank N failed" the others report.
class FirstError {
 public:
  void offer(const Status& s) {
    MutexLock lock(mu_);
    if (!s.ok() &&
        (first_.ok() || (first_.code() == Code::kAborted && s.code() != Code::kAborted))) {
      first_ = s;
    }
  }
  Status get() {
    MutexLock lock(mu_);
    return first_;
  }

 private:
  Mutex mu_;
  Status first_ FERRY_GUARDED_BY(mu_);
};

// Runs fn(group) on `size` threads; the first error wins.
Status run_local_ranks(int size, const std::function<std::string(int)>& node_of,
                       const std::function<Status(RankGroup&)>& fn) {
  const std::string address = group_address();
  FirstError first;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      LocalGroupOptions o;
      o.root_address = address;
      o.rank = r;
      o.size = size;
      o.node = node_of(r);
      auto g = connect_local_group(o);
      first.offer(g.ok() ? fn(**g) : g.status());
    });
  }
  for (std::thread& t : threads) t.join();
  return first.get();
}

// Sums the bytes the ranks report and hands (done, total) to one callback, one call
// at a time.
class SharedProgress {
 public:
  explicit SharedProgress(FolderProgress out) : out_(std::move(out)) {}
  SharedProgress(FolderProgress out, const std::vector<TensorView>& views) : out_(std::move(out)) {
    for (const TensorView& v : views) total_ += v.data.size();
  }

  void set_total(std::uint64_t total) {
    MutexLock lock(mu_);
    total_ = total;
  }

  std::function<void(std::uint64_t)> sink() {
    if (!out_) return {};
    return [this](std::uint64_t n) {
      MutexLock lock(mu_);
      done_ += n;
      out_(done_, total_);
    };
  }

 private:
  Mutex mu_;
  FolderProgress out_;  // called under mu_: one call at a time
  std::uint64_t total_ FERRY_GUARDED_BY(mu_) = 0;
  std::uint64_t done_ FERRY_GUARDED_BY(mu_) = 0;
};

// True unless process `pid` is certainly gone (kill() can also fail with EPERM for a
// live process of another user).
bool process_alive(long pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

// The pid of a temp `<prefix>.tmp.<pid>`, or -1 when `name` is not one.
long temp_pid(const std::string& name, const std::string& prefix) {
  const std::string head = prefix + ".tmp.";
  if (name.size() <= head.size() || name.compare(0, head.size(), head) != 0) return -1;
  const std::string digits = name.substr(head.size());
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return static_cast<long>(parse_uint(digits).value_or(-1));
}

// Removes what killed loads left: temp folders `.<name>.tmp.<pid>` beside the output,
// and (from older versions) `<file>.tmp.<pid>` inside it, when that pid is gone.
void remove_stale_temps(const fs::path& parent, const std::string& name) {
  std::error_code ec;
  auto sweep = [&](const fs::path& dir, bool folders) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string entry = e.path().filename().string();
      const auto dot = entry.rfind(".tmp.");
      if (dot == std::string::npos) continue;
      const std::string prefix = entry.substr(0, dot);
      if (folders && prefix != "." + name) continue;
      const long pid = temp_pid(entry, prefix);
      if (pid < 0 || pid == ::getpid() || process_alive(pid)) continue;
      log::info("checkpoint: removing {}, left by process {} which is gone", e.path().string(),
                pid);
      fs::remove_all(e.path(), ec);
    }
  };
  sweep(parent, true);
  if (fs::is_directory(parent / name, ec)) sweep(parent / name, false);
}

// Puts the finished folder `tmp` in place of `out`: atomically when `out` is absent
// or empty, or (replacing) by exchanging the two and removing the old one.
Status move_into_place(const fs::path& tmp, const fs::path& out) {
  if (::rename(tmp.c_str(), out.c_str()) == 0) return ok_status();
  if (errno != ENOTEMPTY && errno != EEXIST) return errno_status("rename", out.string(), errno);
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) != 0) {
    return errno_status("rename (exchange)", out.string(), errno);
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);  // now the old folder
  if (ec) log::warn("checkpoint: could not remove the replaced {}: {}", tmp.string(), ec.message());
  return ok_status();
}

}  // namespace

std::vector<std::string> expand_roots(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    if (is_root(a)) {
      out.push_back(a);
      continue;
    }
    std::vector<std::string> inner;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(a, ec)) {
      if (e.is_directory(ec) && is_root(e.path().string())) inner.push_back(e.path().string());
    }
    std::sort(inner.begin(), inner.end());
    if (inner.empty()) out.push_back(a);
    out.insert(out.end(), inner.begin(), inner.end());
  }
  return out;
}

Result<std::int64_t> save_model_folder(const std::string& hf_folder, const std::string& root_prefix,
                                       const FolderSaveOptions& o) {
  if (o.ranks <= 0 || o.nodes <= 0 || o.nodes > o.ranks) {
    return invalid_argument("--ranks must be positive and at least --nodes (" +
                            std::to_string(o.ranks) + " ranks, " + std::to_string(o.nodes) +
                            " nodes)");
  }
  auto folder = ModelFolder::open(hf_folder);
  if (!folder.ok()) return folder.status();
  auto node_of = [&](int r) { return "node" + std::to_string(r * o.nodes / o.ranks); };
  std::int64_t step = 1;
  if (o.step) {
    if (*o.step < 0) return invalid_argument("step " + std::to_string(*o.step) + " is negative");
    step = *o.step;
  } else {
    for (int n = 0; n < o.nodes; ++n) {
      for (std::int64_t s : format::list_step_folders(root_prefix + "/node" + std::to_string(n))) {
        step = std::max(step, s + 1);
      }
    }
  }
  json common = {{"source", "hf"}};
  const std::string config = hf_folder + "/config.json";
  if (format::file_exists(config)) {  // optional, but never dropped when present
    auto text = read_file(config);
    if (!text.ok()) return text.status();
    try {
      common["hf_config"] = json::parse(*text);
    } catch (const json::parse_error& e) {
      return corruption(config + " is not valid JSON: " + e.what());
    }
  }
  json order = json::array();
  for (const ModelTensor& t : folder->index().tensors) order.push_back(t.entry.spec.name);
  common["tensor_order"] = order;
  const std::string common_text = common.dump();
  SharedProgress progress(o.progress, folder->views());
  Status s = run_local_ranks(o.ranks, node_of, [&](RankGroup& g) -> Status {
    Checkpointer ckpt(g, {.root = root_prefix + "/" + g.node(), .progress = progress.sink()});
    std::vector<SliceView> mine;
    for (const TensorView& v : folder->views()) {
      const auto& shape = v.spec.shape;
      if (shape.empty() || shape[0] == 0) {  // scalars and empty tensors: rank 0 holds them
        if (g.rank() == 0)
          mine.push_back({SliceSpec::whole(v.spec.name, v.spec.dtype, shape), v.data});
        continue;
      }
      const std::int64_t rows = shape[0];
      const std::int64_t b = rows * g.rank() / g.size(), e = rows * (g.rank() + 1) / g.size();
      if (e == b) continue;
      const std::uint64_t row_bytes = v.data.size() / static_cast<std::uint64_t>(rows);
      mine.push_back({SliceSpec::along(v.spec.name, v.spec.dtype, shape, 0, b, e - b),
                      v.data.subspan(static_cast<std::size_t>(b) * row_bytes,
                                     static_cast<std::size_t>(e - b) * row_bytes)});
    }
    return ckpt.save(step, mine, common_text);
  });
  if (!s.ok()) return s;
  return step;
}

Result<LoadInfo> load_model_folder(const std::vector<std::string>& roots, const std::string& out,
                                   const FolderLoadOptions& o) {
  if (roots.empty()) return invalid_argument("no checkpoint root given");
  if (out.empty()) return invalid_argument("no output folder given");
  // One rank per root, named after the node its files belong to where known.
  std::vector<std::string> nodes;
  auto listing = list_steps(roots);
  if (!listing.ok()) return listing.status();
  for (std::size_t i = 0; i < roots.size(); ++i) {
    std::string n;
    for (const StepListing& l : *listing)
      if (!l.roots[i].node.empty()) n = l.roots[i].node;
    if (n.empty() || std::find(nodes.begin(), nodes.end(), n) != nodes.end()) {
      n = "root" + std::to_string(i);
    }
    nodes.push_back(n);
  }
  // Built as .<name>.tmp.<pid> beside `out` and renamed into place when complete.
  fs::path target = fs::path(out).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/"
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string base = target.filename().string();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) {
    return not_found("--to " + out + ": folder " + parent.string() + " does not exist");
  }
  remove_stale_temps(parent, base);
  if (fs::exists(target, ec)) {
    if (!fs::is_directory(target, ec))
      return already_exists("--to " + out + " exists and is not a folder");
    if (!fs::is_empty(target, ec) && !o.overwrite) {
      return already_exists("--to " + out + " exists and is not empty; pass --force to replace it");
    }
  }
  const fs::path tmp_dir = parent / ("." + base + ".tmp." + std::to_string(::getpid()));
  fs::remove_all(tmp_dir, ec);
  if (!fs::create_directory(tmp_dir, ec))
    return errno_status("mkdir", tmp_dir.string(), ec.value());
  struct RemoveUnlessKept {
    const fs::path& p;
    bool keep = false;
    ~RemoveUnlessKept() {
      std::error_code ignored;
      if (!keep) fs::remove_all(p, ignored);
    }
  } cleanup{tmp_dir};
  const std::string tmp = tmp_dir.string();
  LoadInfo result;
  SharedProgress progress(o.progress);
  Status s = run_local_ranks(
      static_cast<int>(roots.size()), [&](int r) { return nodes[r]; },
      [&](RankGroup& g) -> Status {
        Checkpointer ckpt(
            g, {.root = roots[g.rank()], .progress = g.rank() == 0 ? progress.sink() : nullptr});
        auto info = ckpt.prepare_load(o.step);
        if (!info.ok()) return info.status();
        if (g.rank() != 0) return ckpt.load({}).status();  // serve this root's shards
        // Rank 0 loads every tensor straight into the mapped output file.
        const Manifest& m = info->manifest;
        json common = json::parse(m.common_state, nullptr, false);
        std::vector<std::string> order;
        if (!common.is_discarded() && common.contains("tensor_order")) {
          order = common["tensor_order"].get<std::vector<std::string>>();
        }
        if (order.size() != m.tensors.size()) {
          order.clear();
          for (const SavedTensor& t : m.tensors) order.push_back(t.name);
        }
        std::vector<TensorSpec> specs;
        for (const std::string& name : order) {
          const SavedTensor* t = m.find(name);
          if (t == nullptr)
            return corruption("tensor_order names " + name + ", which is not saved");
          specs.push_back({t->name, t->dtype, t->shape});
        }
        auto header = build_safetensors_header(specs, {{"format", "pt"}});
        if (!header.ok()) return header.status();
        std::uint64_t data_bytes = 0;
        for (const TensorSpec& t : specs) data_bytes += t.bytes();
        progress.set_total(data_bytes);
        // Loaded straight into a mapping of the output file (no second copy of the
        // model in memory), inside the temp folder.
        const std::string path = tmp + "/model.safetensors";
        Env& env = Env::current();
        FERRY_ASSIGN_OR_RETURN(
            ScopedFd fd, env.open_for_write(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
        const std::uint64_t total = header->size() + data_bytes;
        FERRY_RETURN_IF_ERROR(env.truncate(fd.get(), total, path));
        FERRY_RETURN_IF_ERROR(env.pwrite(fd.get(), as_bytes(*header), 0, path));
        MappedRegion map;
        if (total > 0) {
          void* addr = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
          if (addr == MAP_FAILED) return errno_status("mmap", path, errno);
          map = MappedRegion(addr, total);
        }
        std::vector<MutableSliceView> dst;
        std::uint64_t at = header->size();
        for (const TensorSpec& t : specs) {
          dst.push_back({SliceSpec::whole(t.name, t.dtype, t.shape), {map.data() + at, t.bytes()}});
          at += t.bytes();
        }
        auto stats = ckpt.load(dst);
        if (!stats.ok()) return stats.status();
        if (total > 0 && ::msync(map.data(), total, MS_SYNC) != 0)
          return errno_status("msync", path, errno);
        map.reset();
        FERRY_RETURN_IF_ERROR(env.sync(fd.get(), path));
        if (!common.is_discarded() && common.contains("hf_config")) {
          if (Status c =
                  write_file_atomic(tmp + "/config.json", common["hf_config"].dump(2) + "\n");
              !c.ok()) {
            return c;
          }
        }
        result = std::move(*info);
        return ok_status();
      });
  if (!s.ok()) return s;
  FERRY_RETURN_IF_ERROR(move_into_place(tmp_dir, target));
  cleanup.keep = true;
  return result;
}

}  // namespace ferry::checkpoint

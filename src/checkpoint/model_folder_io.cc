// `ferry ckpt save|load` in one process: ranks are threads of a local group,
// nodes are folders. Saving splits every tensor of a Hugging Face folder along
// dim 0; loading reassembles whole tensors into one model.safetensors.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "base/file_util.h"
#include "checkpoint/format.h"
#include "ferry/checkpoint.h"
#include "ferry/safetensors.h"

namespace ferry::checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool is_root(const std::string& dir) {
  return !format::list_step_folders(dir).empty() ||
         format::file_exists(dir + "/" + std::string(format::kLatestFile));
}

std::string group_address() {
  std::random_device rd;
  return "@ferry-ckpt-cli-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
}

// Runs fn(group) on `size` threads; the first error wins.
Status run_local_ranks(int size, const std::function<std::string(int)>& node_of,
                       const std::function<Status(RankGroup&)>& fn) {
  const std::string address = group_address();
  std::mutex mu;
  Status first;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      LocalGroupOptions o;
      o.root_address = address;
      o.rank = r;
      o.size = size;
      o.node = node_of(r);
      auto g = connect_local_group(o);
      Status s = g.ok() ? fn(**g) : g.status();
      std::lock_guard<std::mutex> lock(mu);
      // A rank's own error beats the "rank N failed" the others report.
      if (!s.ok() && (first.ok() || (first.code() == Code::kAborted && s.code() != Code::kAborted))) {
        first = s;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return first;
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
                            std::to_string(o.ranks) + " ranks, " + std::to_string(o.nodes) + " nodes)");
  }
  auto folder = ModelFolder::open(hf_folder);
  if (!folder.ok()) return folder.status();
  auto node_of = [&](int r) { return "node" + std::to_string(r * o.nodes / o.ranks); };
  std::int64_t step = 1;
  if (o.step) {
    step = *o.step;
  } else {
    for (int n = 0; n < o.nodes; ++n) {
      for (std::int64_t s : format::list_step_folders(root_prefix + "/node" + std::to_string(n))) {
        step = std::max(step, s + 1);
      }
    }
  }
  json common = {{"source", "hf"}};
  if (auto cfg = read_file(hf_folder + "/config.json"); cfg.ok()) {
    json c = json::parse(*cfg, nullptr, false);
    if (!c.is_discarded()) common["hf_config"] = c;
  }
  json order = json::array();
  for (const ModelTensor& t : folder->index().tensors) order.push_back(t.entry.spec.name);
  common["tensor_order"] = order;
  const std::string common_text = common.dump();
  Status s = run_local_ranks(o.ranks, node_of, [&](RankGroup& g) -> Status {
    Checkpointer ckpt(g, {.root = root_prefix + "/" + g.node()});
    std::vector<SliceView> mine;
    for (const TensorView& v : folder->views()) {
      const auto& shape = v.spec.shape;
      if (shape.empty() || shape[0] == 0) {  // scalars and empty tensors: rank 0 holds them
        if (g.rank() == 0) mine.push_back({SliceSpec::whole(v.spec.name, v.spec.dtype, shape), v.data});
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
                                   std::optional<std::int64_t> step) {
  if (roots.empty()) return invalid_argument("no checkpoint root given");
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
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return errno_status("mkdir", out, ec.value());
  LoadInfo result;
  Status s = run_local_ranks(static_cast<int>(roots.size()), [&](int r) { return nodes[r]; },
                             [&](RankGroup& g) -> Status {
    Checkpointer ckpt(g, {.root = roots[g.rank()]});
    auto info = ckpt.prepare_load(step);
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
      if (t == nullptr) return corruption("tensor_order names " + name + ", which is not saved");
      specs.push_back({t->name, t->dtype, t->shape});
    }
    auto header = build_safetensors_header(specs, {{"format", "pt"}});
    if (!header.ok()) return header.status();
    std::uint64_t data_bytes = 0;
    for (const TensorSpec& t : specs) data_bytes += t.bytes();
    // Loaded straight into a mapping of the output file (no second copy of the
    // model in memory); it appears under its name only when complete, like AtomicFile.
    const std::string path = out + "/model.safetensors";
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    ScopedFd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return errno_status("open", tmp, errno);
    struct Unlink {
      const std::string& p;
      bool keep = false;
      ~Unlink() {
        if (!keep) ::unlink(p.c_str());
      }
    } cleanup{tmp};
    const std::uint64_t total = header->size() + data_bytes;
    if (::ftruncate(fd.get(), static_cast<off_t>(total)) != 0) {
      return errno_status("ftruncate", tmp, errno);
    }
    if (Status w = pwrite_all(fd.get(), as_bytes(*header), 0, tmp); !w.ok()) return w;
    MappedRegion map;
    if (total > 0) {
      void* addr = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
      if (addr == MAP_FAILED) return errno_status("mmap", tmp, errno);
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
    if (total > 0 && ::msync(map.data(), total, MS_SYNC) != 0) return errno_status("msync", tmp, errno);
    map.reset();
    if (::fsync(fd.get()) != 0) return errno_status("fsync", tmp, errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0) return errno_status("rename", path, errno);
    cleanup.keep = true;
    if (!common.is_discarded() && common.contains("hf_config")) {
      if (Status c = write_file_atomic(out + "/config.json", common["hf_config"].dump(2) + "\n"); !c.ok()) {
        return c;
      }
    }
    result = std::move(*info);
    return ok_status();
  });
  if (!s.ok()) return s;
  return result;
}

}  // namespace ferry::checkpoint

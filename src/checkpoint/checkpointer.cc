// Collective save (two-phase commit) and load (any layout) of checkpoints.
#include <sys/mman.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "base/file_util.h"
#include "base/log.h"
#include "checkpoint/format.h"
#include "checkpoint/slice.h"
#include "ferry/checkpoint.h"
#include "ferry/safetensors.h"

namespace ferry::checkpoint {

const SavedTensor* Manifest::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SavedTensor& t, std::string_view n) { return t.name < n; });
  return (it != tensors.end() && it->name == name) ? &*it : nullptr;
}

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::uint64_t xxh3(std::span<const std::byte> data) { return XXH3_64bits(data.data(), data.size()); }

Box box_of(const SavedSlice& s) { return {s.offset, s.extent}; }
Box box_of(const SliceSpec& s) { return {s.offset, s.extent}; }

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Status mkdirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return errno_status("mkdir", path, ec.value());
  return ok_status();
}

// Every rank learns whether every rank succeeded: the first failure (by rank)
// is returned to all, so no rank goes on to commit what another could not write.
Status agree(RankGroup& group, const Status& mine, std::string_view phase) {
  json j = {{"code", static_cast<int>(mine.code())}, {"message", mine.message()}};
  auto all = group.all_gather(j.dump());
  if (!all.ok()) return all.status().with_context(std::string(phase));
  if (!mine.ok()) return mine;
  for (std::size_t r = 0; r < all->size(); ++r) {
    json o = json::parse((*all)[r], nullptr, false);
    if (o.is_discarded()) return corruption("malformed status from rank " + std::to_string(r));
    const int code = o.value("code", 0);
    if (code != 0) {
      return aborted(std::string(phase) + ": rank " + std::to_string(r) + " failed: " +
                     o.value("message", std::string()));
    }
  }
  return ok_status();
}

struct ShardFileCache {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
  std::set<std::string> verified;  // "file\0tensor" of slices whose XXH3 matched
};

}  // namespace

struct Checkpointer::Impl {
  RankGroup& group;
  CheckpointOptions opts;

  // Async save.
  std::thread background;
  Status background_status;
  MappedRegion staging;  // anonymous memory, kept between async saves

  // Grows the staging area to `bytes`; `populate` faults it in now rather than
  // during the first copy.
  Status reserve_staging(std::uint64_t bytes, bool populate) {
    if (staging.size() >= bytes) return ok_status();
    staging.reset();
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
    if (p == MAP_FAILED) {
      return errno_status("mmap", "checkpoint staging of " + std::to_string(bytes) + " bytes", errno);
    }
    staging = MappedRegion(p, bytes);
    return ok_status();
  }

  // Load state, shared with the fetch handler's server threads.
  struct LoadState {
    std::int64_t step = 0;
    Manifest manifest;
    std::string manifest_text;  // as read from disk ("" when fetched)
    std::map<std::string, std::vector<int>> file_ranks;  // ranks that can read a file locally
    std::set<std::string> local_files;
    ShardFileCache cache;
  };
  std::shared_ptr<LoadState> load;

  Impl(RankGroup& g, CheckpointOptions o) : group(g), opts(std::move(o)) {}

  void hook(std::string_view phase) const {
    if (opts.test_hook) opts.test_hook(phase);
  }
  std::string step_dir(std::int64_t step) const { return format::step_path(opts.root, step); }

  Status save(std::int64_t step, std::span<const SliceView> slices, std::string_view common);

  // Load helpers.
  Result<RankGroup::FetchReply> handle_fetch(const std::shared_ptr<LoadState>& st, int from,
                                   std::string_view request);
  Result<std::shared_ptr<SafetensorsFile>> open_checked(LoadState& st, const SavedTensor& t,
                                                        const SavedSlice& s);
};

Checkpointer::Checkpointer(RankGroup& group, CheckpointOptions options)
    : impl_(std::make_unique<Impl>(group, std::move(options))) {
  if (impl_->opts.staging_bytes > 0) {
    // Best effort: without it the first async save faults its staging in.
    if (Status s = impl_->reserve_staging(impl_->opts.staging_bytes, true); !s.ok()) {
      log::warn("checkpoint: could not reserve staging: {}", s.to_string());
    }
  }
}

Checkpointer::~Checkpointer() {
  (void)wait();
  impl_->group.set_fetch_handler({});
}

Status Checkpointer::Impl::save(std::int64_t step, std::span<const SliceView> slices,
                                std::string_view common) {
  const int rank = group.rank();
  const std::string dir = step_dir(step);
  // 1. Check the slices and agree on the step and the layout.
  Status local;
  std::set<std::string> names;
  std::vector<const SliceView*> kept;
  if (step < 0) local = invalid_argument("step " + std::to_string(step) + " is negative");
  if (opts.root.empty()) local = invalid_argument("CheckpointOptions.root is empty");
  for (const SliceView& v : slices) {
    if (!local.ok()) break;
    if (Status s = v.spec.validate(); !s.ok()) { local = s; break; }
    if (v.data.size() != v.spec.bytes()) {
      local = invalid_argument("slice " + v.spec.to_string() + " has " +
                               std::to_string(v.data.size()) + " bytes, its extent needs " +
                               std::to_string(v.spec.bytes()));
      break;
    }
    if (!names.insert(v.spec.name).second) {
      local = invalid_argument("rank " + std::to_string(rank) + " passed two slices of tensor " +
                               v.spec.name + " (one per tensor and rank)");
      break;
    }
    if (Box{v.spec.offset, v.spec.extent}.volume() > 0) kept.push_back(&v);
  }
  if (local.ok() && format::file_exists(dir + "/" + std::string(format::kCommittedFile))) {
    local = already_exists("step " + std::to_string(step) + " is already committed in " + dir);
  }
  json hello = {{"node", group.node()}, {"step", step}, {"root", opts.root}};
  auto hellos = group.all_gather(hello.dump());
  if (!hellos.ok()) return hellos.status().with_context("checkpoint save step " + std::to_string(step));
  Layout layout;
  layout.world_size = group.size();
  std::map<std::string, int> per_node, leader_of;
  for (int r = 0; r < group.size(); ++r) {
    json h = json::parse((*hellos)[r], nullptr, false);
    if (h.is_discarded()) return corruption("malformed hello from rank " + std::to_string(r));
    const std::string node = h.value("node", "");
    layout.rank_nodes.push_back(node);
    if (!per_node.count(node)) {
      layout.nodes.push_back(node);
      leader_of[node] = r;
    }
    layout.ranks_per_node = std::max(layout.ranks_per_node, ++per_node[node]);
    if (local.ok() && h.value("step", std::int64_t{-1}) != step) {
      local = invalid_argument("rank " + std::to_string(r) + " saves step " +
                               std::to_string(h.value("step", std::int64_t{-1})) + ", rank " +
                               std::to_string(rank) + " step " + std::to_string(step));
    }
  }
  const bool leader = leader_of[group.node()] == rank;
  // A partial step of the same number (an earlier crash) is replaced.
  if (local.ok() && leader) {
    std::error_code ec;
    if (fs::exists(dir, ec)) {
      log::info("checkpoint: replacing partial step {} in {}", step, dir);
      fs::remove_all(dir, ec);
      if (ec) local = errno_status("remove", dir, ec.value());
    }
    if (local.ok()) local = mkdirs(dir);
  }
  if (Status s = agree(group, local, "checkpoint save step " + std::to_string(step)); !s.ok()) {
    return s;
  }

  // 2. This rank's shard: one safetensors file, a tensor per slice, named after
  // the global tensor with the slice's extent as its shape (HF tools read it).
  const std::string file = format::shard_file(rank);
  const std::string path = dir + "/" + file;
  std::vector<TensorSpec> specs;
  for (const SliceView* v : kept) specs.push_back({v->spec.name, v->spec.dtype, v->spec.extent});
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"ferry.step", std::to_string(step)}, {"ferry.rank", std::to_string(rank)}};
  json mine = json::array();
  std::uint64_t file_bytes = 0;
  {
    auto header = build_safetensors_header(specs, meta);
    if (!header.ok()) {
      local = header.status().with_context(path);
    } else {
      auto writer = SafetensorsWriter::create(path, specs, meta);
      if (!writer.ok()) local = writer.status();
      std::uint64_t at = header->size();
      for (const SliceView* v : kept) {
        if (!local.ok()) break;
        local = writer->write(v->data);
        if (!local.ok()) break;
        mine.push_back({{"name", v->spec.name},
                        {"dtype", std::string(dtype_name(v->spec.dtype))},
                        {"shape", v->spec.global_shape},
                        {"offset", v->spec.offset},
                        {"extent", v->spec.extent},
                        {"data_offset", at},
                        {"bytes", v->data.size()},
                        {"xxh3", hex(xxh3(v->data))}});
        at += v->data.size();
      }
      if (local.ok()) local = writer->finish();
      file_bytes = at;
    }
  }
  hook("shards");
  json part = {{"code", static_cast<int>(local.code())},
               {"message", local.message()},
               {"file_bytes", file_bytes},
               {"slices", mine}};
  if (rank == 0) part["common_state"] = std::string(common);
  auto parts = group.all_gather(part.dump());
  if (!parts.ok()) return parts.status().with_context("checkpoint save step " + std::to_string(step));

  // 3. Every rank builds the same manifest from the gathered parts.
  Manifest m;
  m.step = step;
  m.layout = layout;
  std::map<std::string, SavedTensor> tensors;
  Status built;
  for (int r = 0; r < group.size() && built.ok(); ++r) {
    json p = json::parse((*parts)[r], nullptr, false);
    if (p.is_discarded()) { built = corruption("malformed slice list from rank " + std::to_string(r)); break; }
    if (p.value("code", 0) != 0) {
      built = r == rank ? local
                        : aborted("checkpoint save step " + std::to_string(step) + ": rank " +
                                  std::to_string(r) + " failed: " + p.value("message", std::string()));
      break;
    }
    if (r == 0) m.common_state = p.value("common_state", std::string("{}"));
    const std::string f = format::shard_file(r);
    m.files.push_back({f, r, layout.rank_nodes[r], p.value("file_bytes", std::uint64_t{0})});
    for (const json& s : p["slices"]) {
      const std::string name = s["name"];
      auto dtype = parse_dtype(s["dtype"].get<std::string>());
      const auto shape = s["shape"].get<std::vector<std::int64_t>>();
      auto [it, fresh] = tensors.try_emplace(name);
      SavedTensor& t = it->second;
      if (fresh) {
        t.name = name;
        t.dtype = *dtype;
        t.shape = shape;
      } else if (t.dtype != *dtype || t.shape != shape) {
        built = invalid_argument("tensor " + name + ": rank " + std::to_string(r) + " saves it as " +
                                 TensorSpec{name, *dtype, shape}.to_string() + ", rank " +
                                 std::to_string(t.slices.front().rank) + " as " +
                                 TensorSpec{name, t.dtype, t.shape}.to_string());
        break;
      }
      SavedSlice ss;
      ss.rank = r;
      ss.file = f;
      ss.tensor_in_file = name;
      ss.offset = s["offset"].get<std::vector<std::int64_t>>();
      ss.extent = s["extent"].get<std::vector<std::int64_t>>();
      ss.data_offset = s["data_offset"];
      ss.bytes = s["bytes"];
      ss.xxh3 = std::stoull(s["xxh3"].get<std::string>(), nullptr, 16);
      t.slices.push_back(std::move(ss));
    }
  }
  // Distinct boxes of a tensor must not overlap and must cover it; identical
  // boxes on several ranks are replicas.
  for (auto& [name, t] : tensors) {
    if (!built.ok()) break;
    std::vector<Box> distinct;
    for (const SavedSlice& s : t.slices) {
      Box b = box_of(s);
      if (std::find(distinct.begin(), distinct.end(), b) != distinct.end()) continue;
      for (const Box& o : distinct) {
        if (intersect(o, b)) {
          built = invalid_argument("tensor " + name + ": the slice " +
                                   SliceSpec{name, t.dtype, t.shape, b.offset, b.extent}.to_string() +
                                   " of rank " + std::to_string(s.rank) +
                                   " overlaps another rank's slice without being identical");
        }
      }
      distinct.push_back(std::move(b));
    }
    std::int64_t covered = 0, total = 1;
    for (const Box& b : distinct) covered += b.volume();
    for (std::int64_t d : t.shape) total *= d;
    if (built.ok() && covered != total) {
      built = invalid_argument("tensor " + name + ": the ranks' slices cover " +
                               std::to_string(covered) + " of its " + std::to_string(total) +
                               " elements");
    }
    m.tensors.push_back(std::move(t));
  }
  if (!built.ok()) return built;  // every rank saw the same parts: all fail alike

  // 4. The manifest on every node, then the node markers, then COMMITTED, then latest.
  const std::string step_name = "checkpoint save step " + std::to_string(step);
  Status s;
  if (leader) s = write_file_atomic(dir + "/" + std::string(format::kManifestFile),
                                    format::encode_manifest(m));
  hook("manifest");
  if (s = agree(group, s, step_name + " (writing the manifest)"); !s.ok()) return s;
  if (leader) s = write_file_atomic(dir + "/" + format::node_marker_file(group.node()),
                                    format::encode_node_marker(step, group.node(), m.files));
  hook("node_marker");
  if (s = agree(group, s, step_name + " (writing node markers)"); !s.ok()) return s;
  if (leader) {
    json c = {{"step", step}, {"nodes", layout.nodes}};
    s = write_file_atomic(dir + "/" + std::string(format::kCommittedFile), c.dump() + "\n");
  }
  hook("committed");
  if (s = agree(group, s, step_name + " (writing COMMITTED)"); !s.ok()) return s;
  if (leader) s = format::write_latest(opts.root, step);
  hook("latest");
  return agree(group, s, step_name + " (updating latest)");
}

Status Checkpointer::save(std::int64_t step, std::span<const SliceView> slices,
                          std::string_view common_state) {
  if (Status s = wait(); !s.ok()) return s;
  return impl_->save(step, slices, common_state);
}

Status Checkpointer::save_async(std::int64_t step, std::span<const SliceView> slices,
                                std::string_view common_state) {
  if (Status s = wait(); !s.ok()) return s;
  Impl& m = *impl_;
  std::uint64_t total = 0;
  for (const SliceView& v : slices) total += v.data.size();
  if (Status s = m.reserve_staging(total, false); !s.ok()) return s;
  auto staged = std::make_shared<std::vector<SliceView>>();
  std::uint64_t at = 0;
  for (const SliceView& v : slices) {
    std::memcpy(m.staging.data() + at, v.data.data(), v.data.size());
    staged->push_back({v.spec, {m.staging.data() + at, v.data.size()}});
    at += v.data.size();
  }
  m.background = std::thread([&m, step, staged, common = std::string(common_state)] {
    m.background_status = m.save(step, *staged, common);
  });
  return ok_status();
}

Status Checkpointer::wait() {
  Impl& m = *impl_;
  if (m.background.joinable()) m.background.join();
  return std::exchange(m.background_status, Status());
}

// ---------------------------------------------------------------------------
// Load.

Result<std::shared_ptr<SafetensorsFile>> Checkpointer::Impl::open_checked(LoadState& st,
                                                                           const SavedTensor& t,
                                                                           const SavedSlice& s) {
  const std::string path = step_dir(st.step) + "/" + s.file;
  std::shared_ptr<SafetensorsFile> file;
  {
    std::lock_guard<std::mutex> lock(st.cache.mu);
    auto it = st.cache.files.find(s.file);
    if (it != st.cache.files.end()) file = it->second;
  }
  if (!file) {
    auto opened = SafetensorsFile::open(path);
    if (!opened.ok()) return opened.status().with_context("shard of tensor " + t.name);
    file = std::make_shared<SafetensorsFile>(std::move(*opened));
    std::lock_guard<std::mutex> lock(st.cache.mu);
    st.cache.files.emplace(s.file, file);
  }
  const std::string key = s.file + '\0' + s.tensor_in_file;
  {
    std::lock_guard<std::mutex> lock(st.cache.mu);
    if (st.cache.verified.count(key)) return file;
  }
  const SafetensorsEntry* e = file->header().find(s.tensor_in_file);
  if (e == nullptr || e->spec.dtype != t.dtype || e->spec.shape != s.extent ||
      file->header().data_offset + e->begin != s.data_offset || e->end - e->begin != s.bytes) {
    return corruption(path + ": tensor " + t.name +
                      " is not where the manifest puts it (dtype, shape or offset differ)");
  }
  const TensorView v = file->view(*e);
  if (const std::uint64_t got = xxh3(v.data); got != s.xxh3) {
    return corruption(path + ": tensor " + t.name + " slice " +
                      SliceSpec{t.name, t.dtype, t.shape, s.offset, s.extent}.to_string() +
                      ": XXH3 " + hex(got) + " does not match the manifest's " + hex(s.xxh3));
  }
  std::lock_guard<std::mutex> lock(st.cache.mu);
  st.cache.verified.insert(key);
  return file;
}

Result<RankGroup::FetchReply> Checkpointer::Impl::handle_fetch(const std::shared_ptr<LoadState>& st, int from,
                                                     std::string_view request) {
  json q = json::parse(request, nullptr, false);
  if (q.is_discarded()) return invalid_argument("malformed fetch request from rank " + std::to_string(from));
  const std::string op = q.value("op", "");
  const std::int64_t step = q.value("step", std::int64_t{-1});
  if (op == "manifest") {
    auto text = read_file(step_dir(step) + "/" + std::string(format::kManifestFile));
    if (!text.ok()) return text.status();
    return RankGroup::FetchReply{std::move(*text), {}, nullptr};
  }
  if (op != "slice" || step != st->step) {
    return invalid_argument("fetch request '" + op + "' of step " + std::to_string(step) +
                            " from rank " + std::to_string(from) + " is not being served");
  }
  const SavedTensor* t = st->manifest.find(q.value("tensor", ""));
  const std::size_t index = q.value("slice", std::size_t{0});
  if (t == nullptr || index >= t->slices.size()) {
    return not_found("rank " + std::to_string(from) + " asked for an unknown slice");
  }
  const SavedSlice& s = t->slices[index];
  Box region;
  try {
    region = {q.at("offset").get<std::vector<std::int64_t>>(),
              q.at("extent").get<std::vector<std::int64_t>>()};
  } catch (const json::exception&) {
    return invalid_argument("fetch request without a region from rank " + std::to_string(from));
  }
  auto inside = intersect(region, box_of(s));
  if (!inside || !(*inside == region)) return invalid_argument("fetch region outside the slice");
  if (!st->local_files.count(s.file)) return not_found(s.file + " is not on node " + group.node());
  auto file = open_checked(*st, *t, s);
  if (!file.ok()) return file.status();
  const TensorView v = (*file)->view(*(*file)->header().find(s.tensor_in_file));
  const std::size_t eb = static_cast<std::size_t>(dtype_bits(t->dtype) / 8);
  const std::size_t n = static_cast<std::size_t>(region.volume()) * eb;
  if (auto at = contiguous_offset(region, box_of(s))) {  // sent straight from the mapping
    return RankGroup::FetchReply{{}, v.data.subspan(static_cast<std::size_t>(*at) * eb, n), *file};
  }
  std::string out(n, '\0');
  copy_region(region, v.data, box_of(s), {reinterpret_cast<std::byte*>(out.data()), out.size()},
              region, eb);
  return RankGroup::FetchReply{std::move(out), {}, nullptr};
}

Result<LoadInfo> Checkpointer::prepare_load(std::optional<std::int64_t> wanted) {
  if (Status s = wait(); !s.ok()) return s;
  Impl& m = *impl_;
  RankGroup& g = m.group;
  auto st = std::make_shared<Impl::LoadState>();
  // Serve manifests and slices from now until the end of load().
  g.set_fetch_handler([&m, st](int from, std::string_view req) { return m.handle_fetch(st, from, req); });

  // 1. What every node holds.
  json mine = json::object();
  for (std::int64_t step : format::list_step_folders(m.opts.root)) {
    NodeStepState ns = format::scan_step(m.opts.root, step);
    mine[std::to_string(step)] = {{"committed", ns.committed}, {"manifest", ns.manifest}};
  }
  auto all = g.all_gather(mine.dump());
  if (!all.ok()) return all.status().with_context("checkpoint load");
  std::map<std::int64_t, std::vector<int>> committed_on, manifest_on;
  for (int r = 0; r < g.size(); ++r) {
    json j = json::parse((*all)[r], nullptr, false);
    if (j.is_discarded()) return corruption("malformed step list from rank " + std::to_string(r));
    for (auto& [k, v] : j.items()) {
      const std::int64_t step = std::stoll(k);
      if (v.value("committed", false)) committed_on[step].push_back(r);
      if (v.value("manifest", false)) manifest_on[step].push_back(r);
    }
  }
  LoadInfo info;
  if (wanted) {
    if (!committed_on.count(*wanted)) {
      return failed_precondition("checkpoint step " + std::to_string(*wanted) +
                                 " is not committed on any node" +
                                 (manifest_on.count(*wanted) ? " (it is partial)" : ""));
    }
    info.step = *wanted;
  } else {
    if (committed_on.empty()) return not_found("no committed checkpoint on any node (root " + m.opts.root + " on node " + g.node() + ")");
    info.step = committed_on.rbegin()->first;
  }
  st->step = info.step;
  const std::string dir = m.step_dir(info.step);
  const auto& committers = committed_on[info.step];
  if (std::none_of(committers.begin(), committers.end(),
                   [&](int r) { return g.rank() == r; }) &&
      format::file_exists(dir + "/" + std::string(format::kManifestFile))) {
    info.notes.push_back("step " + std::to_string(info.step) + " is committed on rank " +
                         std::to_string(committers.front()) + "'s node but not on node " +
                         g.node() + " (its save was interrupted after the global commit began)");
  }

  // 2. The manifest: from this node's disk, else from a node that has it.
  Status s;
  std::string text;
  if (auto local = read_file(dir + "/" + std::string(format::kManifestFile)); local.ok()) {
    text = std::move(*local);
  } else {
    const auto& holders = manifest_on[info.step];
    if (holders.empty()) {
      s = not_found("no node has the manifest of step " + std::to_string(info.step));
    } else {
      const int peer = holders.front();
      json q = {{"op", "manifest"}, {"step", info.step}};
      auto fetched = g.fetch(peer, q.dump());
      if (fetched.ok()) {
        text = std::move(*fetched);
        info.notes.push_back("node " + g.node() + " has no manifest for step " +
                             std::to_string(info.step) + "; fetched it from rank " +
                             std::to_string(peer));
      } else {
        s = fetched.status().with_context("fetching the manifest of step " + std::to_string(info.step));
      }
    }
  }
  if (s.ok()) {
    auto decoded = format::decode_manifest(text, dir + "/" + std::string(format::kManifestFile));
    if (!decoded.ok()) s = decoded.status();
    else if (decoded->step != info.step) s = corruption(dir + ": manifest is of another step");
    else st->manifest = std::move(*decoded);
  }
  // 3. Which files each rank can read from its own disk (present, of the right size).
  json have = json::array();
  if (s.ok()) {
    for (const SavedFile& f : st->manifest.files) {
      struct stat sb {};
      if (::stat((dir + "/" + f.file).c_str(), &sb) == 0 &&
          static_cast<std::uint64_t>(sb.st_size) == f.bytes) {
        have.push_back(f.file);
        st->local_files.insert(f.file);
      }
    }
  }
  json report = {{"code", static_cast<int>(s.code())}, {"message", s.message()}, {"files", have},
                 {"notes", info.notes},
                 {"xxh3", hex(XXH3_64bits(text.data(), text.size()))}};
  auto reports = g.all_gather(report.dump());
  if (!reports.ok()) return reports.status().with_context("checkpoint load");
  std::string first_hash;
  for (const std::string& note : info.notes) log::info("checkpoint: {}", note);
  info.notes.clear();  // every rank hears every rank's notes
  for (int r = 0; r < g.size(); ++r) {
    json j = json::parse((*reports)[r], nullptr, false);
    if (j.is_discarded()) return corruption("malformed file list from rank " + std::to_string(r));
    if (j.value("code", 0) != 0) {
      if (r == g.rank()) return s;
      return aborted("checkpoint load: rank " + std::to_string(r) + " failed: " +
                     j.value("message", std::string()));
    }
    const std::string h = j.value("xxh3", "");
    if (r == 0) first_hash = h;
    else if (h != first_hash) {
      return corruption("the manifests of step " + std::to_string(info.step) + " on rank 0's and rank " +
                        std::to_string(r) + "'s nodes differ");
    }
    for (const json& f : j["files"]) st->file_ranks[f.get<std::string>()].push_back(r);
    for (const json& n : j["notes"]) {
      const std::string note = n.get<std::string>();
      if (std::find(info.notes.begin(), info.notes.end(), note) == info.notes.end()) {
        info.notes.push_back(note);
      }
    }
  }
  info.manifest = st->manifest;
  m.load = st;
  return info;
}

Result<LoadStats> Checkpointer::load(std::span<const MutableSliceView> destinations) {
  Impl& m = *impl_;
  RankGroup& g = m.group;
  if (!m.load) return failed_precondition("Checkpointer::load() needs prepare_load() first");
  auto st = m.load;
  LoadStats stats;
  Status s;
  const std::string dir = m.step_dir(st->step);
  for (const MutableSliceView& d : destinations) {
    if (!s.ok()) break;
    if (s = d.spec.validate(); !s.ok()) break;
    const SavedTensor* t = st->manifest.find(d.spec.name);
    if (t == nullptr) {
      s = not_found("tensor " + d.spec.name + " is not in checkpoint step " + std::to_string(st->step));
      break;
    }
    if (t->dtype != d.spec.dtype || t->shape != d.spec.global_shape) {
      s = invalid_argument("tensor " + d.spec.name + " is saved as " +
                           TensorSpec{t->name, t->dtype, t->shape}.to_string() + ", asked for as " +
                           TensorSpec{t->name, d.spec.dtype, d.spec.global_shape}.to_string());
      break;
    }
    if (d.data.size() != d.spec.bytes()) {
      s = invalid_argument("destination of " + d.spec.to_string() + " has the wrong size");
      break;
    }
    const Box want = box_of(d.spec);
    const std::size_t eb = static_cast<std::size_t>(std::max(1, dtype_bits(t->dtype) / 8));
    std::vector<Box> done;  // replicas: each distinct box once
    // Prefer a replica this node has.
    std::vector<std::size_t> order(t->slices.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return st->local_files.count(t->slices[a].file) > st->local_files.count(t->slices[b].file);
    });
    for (std::size_t i : order) {
      const SavedSlice& sl = t->slices[i];
      const Box src = box_of(sl);
      if (std::find(done.begin(), done.end(), src) != done.end()) continue;
      auto region = intersect(want, src);
      if (!region && want.volume() > 0) continue;
      if (!region) continue;
      done.push_back(src);
      const bool whole = src == want && *region == want;
      if (st->local_files.count(sl.file)) {
        auto file = m.open_checked(*st, *t, sl);
        if (!file.ok()) { s = file.status(); break; }
        const TensorView v = (*file)->view(*(*file)->header().find(sl.tensor_in_file));
        if (whole) std::memcpy(d.data.data(), v.data.data(), v.data.size());
        else copy_region(*region, v.data, src, d.data, want, eb);
        stats.local_bytes += static_cast<std::uint64_t>(region->volume()) * eb;
        continue;
      }
      auto owners = st->file_ranks.find(sl.file);
      if (owners == st->file_ranks.end() || owners->second.empty()) {
        s = not_found("shard " + sl.file + " of tensor " + t->name + " (rank " +
                      std::to_string(sl.rank) + ", node " + st->manifest.layout.rank_nodes[sl.rank] +
                      ") is on no node of this load: missing or truncated in " + dir);
        break;
      }
      const int peer = owners->second.front();
      json q = {{"op", "slice"}, {"step", st->step}, {"tensor", t->name}, {"slice", i},
                {"offset", region->offset}, {"extent", region->extent}};
      const std::size_t want_bytes = static_cast<std::size_t>(region->volume()) * eb;
      const std::string what = "fetching " + t->name + " from rank " + std::to_string(peer);
      if (auto at = contiguous_offset(*region, want)) {  // straight into the destination
        s = g.fetch_into(peer, q.dump(), d.data.subspan(static_cast<std::size_t>(*at) * eb, want_bytes));
        if (!s.ok()) { s = s.with_context(what); break; }
      } else {
        std::vector<std::byte> got(want_bytes);
        s = g.fetch_into(peer, q.dump(), got);
        if (!s.ok()) { s = s.with_context(what); break; }
        copy_region(*region, got, *region, d.data, want, eb);
      }
      stats.remote_bytes += want_bytes;
    }
  }
  // Serve the others until every rank is done, then stop.
  Status all = agree(g, s, "checkpoint load step " + std::to_string(st->step));
  g.set_fetch_handler({});
  m.load.reset();
  if (!all.ok()) return all;
  return stats;
}

}  // namespace ferry::checkpoint

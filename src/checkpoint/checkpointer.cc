// Collective save (two-phase commit) of checkpoints; load.cc has the load.
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "base/env.h"
#include "base/file_util.h"
#include "base/log.h"
#include "checkpoint/checkpointer_impl.h"
#include "checkpoint/format.h"

namespace ferry::checkpoint {

const SavedTensor* Manifest::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SavedTensor& t, std::string_view n) { return t.name < n; });
  return (it != tensors.end() && it->name == name) ? &*it : nullptr;
}

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

Status mkdirs(const std::string& path) { return Env::current().create_dirs(path); }

}  // namespace

std::uint64_t xxh3(std::span<const std::byte> data) { return XXH3_64bits(data.data(), data.size()); }

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Status agree(RankGroup& group, const Status& mine, std::string_view phase) {
  json j = {{"code", static_cast<int>(mine.code())}, {"message", mine.message()}};
  auto all = group.all_gather(j.dump());
  if (!all.ok()) return all.status().with_context(std::string(phase));
  if (!mine.ok()) return mine;
  for (std::size_t r = 0; r < all->size(); ++r) {
    Status s = read_from_rank(static_cast<int>(r), "status", [&] {
      const json o = json::parse((*all)[r]);
      if (o.value("code", 0) == 0) return ok_status();
      return aborted(std::string(phase) + ": rank " + std::to_string(r) + " failed: " +
                     o.value("message", std::string()));
    });
    if (!s.ok()) return s;
  }
  return ok_status();
}

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
    Status s = read_from_rank(r, "hello", [&] {
      const json h = json::parse((*hellos)[r]);
      const std::string node = h.value("node", "");
      layout.rank_nodes.push_back(node);
      if (!per_node.count(node)) {
        layout.nodes.push_back(node);
        leader_of[node] = r;
      }
      layout.ranks_per_node = std::max(layout.ranks_per_node, ++per_node[node]);
      const std::int64_t theirs = h.value("step", std::int64_t{-1});
      if (local.ok() && theirs != step) {
        local = invalid_argument("rank " + std::to_string(r) + " saves step " + std::to_string(theirs) +
                                 ", rank " + std::to_string(rank) + " step " + std::to_string(step));
      }
      return ok_status();
    });
    if (!s.ok()) return s;
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
        if (opts.progress) opts.progress(v->data.size());
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
    built = read_from_rank(r, "slice list", [&]() -> Status {
      const json p = json::parse((*parts)[r]);
      if (p.value("code", 0) != 0) {
        return r == rank ? local
                         : aborted("checkpoint save step " + std::to_string(step) + ": rank " +
                                   std::to_string(r) + " failed: " + p.value("message", std::string()));
      }
      if (r == 0) m.common_state = p.value("common_state", std::string("{}"));
      const std::string f = format::shard_file(r);
      m.files.push_back({f, r, layout.rank_nodes[r], p.value("file_bytes", std::uint64_t{0})});
      for (const json& s : p.at("slices")) {
        const std::string name = s.at("name");
        auto dtype = parse_dtype(s.at("dtype").get<std::string>());
        if (!dtype.ok()) {
          return corruption("malformed slice list from rank " + std::to_string(r) + ": " +
                            dtype.status().message());
        }
        const auto shape = s.at("shape").get<std::vector<std::int64_t>>();
        auto [it, fresh] = tensors.try_emplace(name);
        SavedTensor& t = it->second;
        if (fresh) {
          t.name = name;
          t.dtype = *dtype;
          t.shape = shape;
        } else if (t.dtype != *dtype || t.shape != shape) {
          return invalid_argument("tensor " + name + ": rank " + std::to_string(r) + " saves it as " +
                                  TensorSpec{name, *dtype, shape}.to_string() + ", rank " +
                                  std::to_string(t.slices.front().rank) + " as " +
                                  TensorSpec{name, t.dtype, t.shape}.to_string());
        }
        SavedSlice ss;
        ss.rank = r;
        ss.file = f;
        ss.tensor_in_file = name;
        ss.offset = s.at("offset").get<std::vector<std::int64_t>>();
        ss.extent = s.at("extent").get<std::vector<std::int64_t>>();
        ss.data_offset = s.at("data_offset");
        ss.bytes = s.at("bytes");
        ss.xxh3 = std::stoull(s.at("xxh3").get<std::string>(), nullptr, 16);
        t.slices.push_back(std::move(ss));
      }
      return ok_status();
    });
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

}  // namespace ferry::checkpoint

// Collective save (two-phase commit) of checkpoints; load.cc has the load.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "base/atomic_file.h"
#include "base/env.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "checkpoint/checkpointer_impl.h"
#include "checkpoint/format.h"
#include "checkpoint/shard_format.h"
#include "checkpoint/testing.h"

namespace ferry::checkpoint {

const SavedTensor* Manifest::find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SavedTensor& t, std::string_view n) { return t.name < n; });
  return (it != tensors.end() && it->name == name) ? &*it : nullptr;
}

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

Status mkdirs(const std::string& path) { return Env::current().create_dirs(path); }

// The process-wide save phase hook (checkpoint/testing.h).
Mutex save_phase_hook_mu;
SavePhaseHook& save_phase_hook() FERRY_REQUIRES(save_phase_hook_mu) {
  static SavePhaseHook hook;
  return hook;
}

}  // namespace

void set_save_phase_hook_for_testing(SavePhaseHook hook) {
  MutexLock lock(save_phase_hook_mu);
  save_phase_hook() = std::move(hook);
}

void run_save_phase_hook(std::string_view phase) {
  SavePhaseHook hook;
  {
    MutexLock lock(save_phase_hook_mu);
    hook = save_phase_hook();
  }
  if (hook) hook(phase);
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
      return aborted(std::string(phase) + ": rank " + std::to_string(r) +
                     " failed: " + o.value("message", std::string()));
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

namespace {

std::string save_name(std::int64_t step) { return "checkpoint save step " + std::to_string(step); }

// What phase 1 settles: the layout every rank agreed on, whether this rank writes its
// node's files (the node's first rank), and this rank's slices that hold any elements.
struct SavePlan {
  Layout layout;
  bool leader = false;
  std::vector<const SliceView*> kept;
};

// This rank's checks of its own slices and of the step; the slices with elements go to *kept.
Status check_slices(int rank, std::int64_t step, const CheckpointOptions& opts,
                    const std::string& dir, std::span<const SliceView> slices,
                    std::vector<const SliceView*>* kept) {
  if (step < 0) return invalid_argument("step " + std::to_string(step) + " is negative");
  if (opts.root.empty()) return invalid_argument("CheckpointOptions.root is empty");
  std::set<std::string> names;
  for (const SliceView& v : slices) {
    FERRY_RETURN_IF_ERROR(v.spec.validate());
    if (v.data.size() != v.spec.bytes()) {
      return invalid_argument("slice " + v.spec.to_string() + " has " +
                              std::to_string(v.data.size()) + " bytes, its extent needs " +
                              std::to_string(v.spec.bytes()));
    }
    if (!names.insert(v.spec.name).second) {
      return invalid_argument("rank " + std::to_string(rank) + " passed two slices of tensor " +
                              v.spec.name + " (one per tensor and rank)");
    }
    if (Box{v.spec.offset, v.spec.extent}.volume() > 0) kept->push_back(&v);
  }
  if (format::file_exists(dir + "/" + std::string(format::kCommittedFile))) {
    return already_exists("step " + std::to_string(step) + " is already committed in " + dir);
  }
  return ok_status();
}

// Phase 1: checks the slices, agrees on the step and the layout, and has each node's leader
// make the step folder (replacing a partial one of the same step, left by an earlier crash).
Result<SavePlan> agree_on_step(RankGroup& group, const CheckpointOptions& opts, std::int64_t step,
                               const std::string& dir, std::span<const SliceView> slices) {
  const int rank = group.rank();
  SavePlan plan;
  Status local = check_slices(rank, step, opts, dir, slices, &plan.kept);
  json hello = {{"node", group.node()}, {"step", step}, {"root", opts.root}};
  auto hellos = group.all_gather(hello.dump());
  if (!hellos.ok()) return hellos.status().with_context(save_name(step));
  Layout& layout = plan.layout;
  layout.world_size = group.size();
  std::map<std::string, int> per_node, leader_of;
  for (int r = 0; r < group.size(); ++r) {
    FERRY_RETURN_IF_ERROR(read_from_rank(r, "hello", [&] {
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
        local =
            invalid_argument("rank " + std::to_string(r) + " saves step " + std::to_string(theirs) +
                             ", rank " + std::to_string(rank) + " step " + std::to_string(step));
      }
      return ok_status();
    }));
  }
  plan.leader = leader_of[group.node()] == rank;
  if (local.ok() && plan.leader) {
    std::error_code ec;
    if (fs::exists(dir, ec)) {
      log::info("checkpoint: replacing partial step {} in {}", step, dir);
      fs::remove_all(dir, ec);
      if (ec) local = errno_status("remove", dir, ec.value());
    }
    if (local.ok()) local = mkdirs(dir);
  }
  FERRY_RETURN_IF_ERROR(agree(group, local, save_name(step)));
  return plan;
}

// Phase 2's exchange: every rank's shard status and slice entries, coded as the manifest's
// tensor entries (and rank 0's common state).
Result<std::vector<std::string>> gather_shards(RankGroup& group, std::int64_t step,
                                               const Result<WrittenShard>& shard,
                                               std::string_view common) {
  ojson part = {{"code", static_cast<int>(shard.status().code())},
                {"message", shard.status().message()}};
  if (shard.ok()) {
    ojson tensors = ojson::array();
    for (const SavedTensor& t : shard->tensors) tensors.push_back(format::encode_tensor_entry(t));
    part["file_bytes"] = shard->file.bytes;
    part["tensors"] = std::move(tensors);
  }
  if (group.rank() == 0) part["common_state"] = std::string(common);
  auto parts = group.all_gather(part.dump());
  if (!parts.ok()) return parts.status().with_context(save_name(step));
  return parts;
}

// Adds rank r's part (its shard's file and slices) to the manifest and `tensors`.
Status add_rank_part(int r, const ojson& p, const ShardFormat& shards, const Layout& layout,
                     Manifest* m, std::map<std::string, SavedTensor>* tensors) {
  if (r == 0) m->common_state = p.value("common_state", std::string("{}"));
  const std::string f = shards.file_name(r);
  m->files.push_back({f, r, layout.rank_nodes[r], p.at("file_bytes").get<std::uint64_t>()});
  const std::string source = "malformed slice list from rank " + std::to_string(r);
  for (const ojson& entry : p.at("tensors")) {
    auto part = format::decode_tensor_entry(entry, source);
    if (!part.ok()) return corruption(part.status().message());
    for (const SavedSlice& s : part->slices) {
      if (s.rank != r || s.file != f) {
        return corruption(source + ": tensor " + part->name + " has a slice of rank " +
                          std::to_string(s.rank) + " in " + s.file);
      }
    }
    auto [it, fresh] = tensors->try_emplace(part->name);
    SavedTensor& t = it->second;
    if (fresh) {
      t.name = part->name;
      t.dtype = part->dtype;
      t.shape = part->shape;
    } else if (t.dtype != part->dtype || t.shape != part->shape) {
      return invalid_argument("tensor " + t.name + ": rank " + std::to_string(r) + " saves it as " +
                              TensorSpec{t.name, part->dtype, part->shape}.to_string() + ", rank " +
                              std::to_string(t.slices.front().rank) + " as " +
                              TensorSpec{t.name, t.dtype, t.shape}.to_string());
    }
    t.slices.insert(t.slices.end(), part->slices.begin(), part->slices.end());
  }
  return ok_status();
}

// Distinct boxes of a tensor must not overlap and must cover it; identical boxes on several
// ranks are replicas.
Status check_coverage(const SavedTensor& t) {
  std::vector<Box> distinct;
  for (const SavedSlice& s : t.slices) {
    Box b = box_of(s);
    if (std::find(distinct.begin(), distinct.end(), b) != distinct.end()) continue;
    for (const Box& o : distinct) {
      if (intersect(o, b)) {
        return invalid_argument(
            "tensor " + t.name + ": the slice " +
            SliceSpec{t.name, t.dtype, t.shape, b.offset, b.extent}.to_string() + " of rank " +
            std::to_string(s.rank) + " overlaps another rank's slice without being identical");
      }
    }
    distinct.push_back(std::move(b));
  }
  std::int64_t covered = 0, total = 1;
  for (const Box& b : distinct) covered += b.volume();
  for (std::int64_t d : t.shape) total *= d;
  if (covered != total) {
    return invalid_argument("tensor " + t.name + ": the ranks' slices cover " +
                            std::to_string(covered) + " of its " + std::to_string(total) +
                            " elements");
  }
  return ok_status();
}

// Phase 3: every rank builds the same manifest from the gathered parts, so all fail alike.
// `mine` is this rank's own shard status (its part says only its code and message).
Result<Manifest> build_manifest(int rank, std::int64_t step, const ShardFormat& shards,
                                const Layout& layout, const std::vector<std::string>& parts,
                                const Status& mine) {
  Manifest m;
  m.shard_format = std::string(shards.name());
  m.step = step;
  m.layout = layout;
  std::map<std::string, SavedTensor> tensors;
  for (int r = 0; r < static_cast<int>(parts.size()); ++r) {
    FERRY_RETURN_IF_ERROR(read_from_rank(r, "slice list", [&]() -> Status {
      const ojson p = ojson::parse(parts[r]);
      if (p.value("code", 0) != 0) {
        return r == rank ? mine
                         : aborted(save_name(step) + ": rank " + std::to_string(r) +
                                   " failed: " + p.value("message", std::string()));
      }
      return add_rank_part(r, p, shards, layout, &m, &tensors);
    }));
  }
  for (auto& [name, t] : tensors) {
    FERRY_RETURN_IF_ERROR(check_coverage(t));
    m.tensors.push_back(std::move(t));
  }
  return m;
}

// Phase 4: the manifest on every node, then the node markers, then COMMITTED, then latest;
// every rank agrees after each, so none goes on past a node that could not write.
Status commit(RankGroup& group, const CheckpointOptions& opts, std::int64_t step,
              const std::string& dir, const Manifest& m, bool leader) {
  const std::string step_name = save_name(step);
  Status s;
  if (leader) {
    s = write_file_atomic(dir + "/" + std::string(format::kManifestFile),
                          format::encode_manifest(m));
  }
  run_save_phase_hook("manifest");
  FERRY_RETURN_IF_ERROR(agree(group, s, step_name + " (writing the manifest)"));
  if (leader) {
    s = write_file_atomic(dir + "/" + format::node_marker_file(group.node()),
                          format::encode_node_marker(step, group.node(), m.files));
  }
  run_save_phase_hook("node_marker");
  FERRY_RETURN_IF_ERROR(agree(group, s, step_name + " (writing node markers)"));
  if (leader) {
    json c = {{"step", step}, {"nodes", m.layout.nodes}};
    s = write_file_atomic(dir + "/" + std::string(format::kCommittedFile), c.dump() + "\n");
  }
  run_save_phase_hook("committed");
  FERRY_RETURN_IF_ERROR(agree(group, s, step_name + " (writing COMMITTED)"));
  // From here the step is committed on every node and loads whatever happens: a failure
  // below must not read as a failed save.
  if (leader) s = format::write_latest(opts.root, step);
  run_save_phase_hook("latest");
  Status latest = agree(group, s, step_name + " (updating latest)");
  if (latest.ok()) return latest;
  return Status(latest.code(),
                step_name +
                    " is committed on every node (it loads: prepare_load takes the newest "
                    "committed step), then failed updating latest: " +
                    latest.message());
}

}  // namespace

Status Checkpointer::Impl::save(std::int64_t step, std::span<const SliceView> slices,
                                std::string_view common) {
  const std::string dir = step_dir(step);
  FERRY_ASSIGN_OR_RETURN(const SavePlan plan, agree_on_step(group, opts, step, dir, slices));
  FERRY_ASSIGN_OR_RETURN(const ShardFormat* shards, shard_format_for(kDefaultShardFormat));
  // Phase 2: this rank's shard file.
  const Result<WrittenShard> shard =
      shards->write(dir, step, group.rank(), plan.kept, opts.progress);
  run_save_phase_hook("shards");
  FERRY_ASSIGN_OR_RETURN(const auto parts, gather_shards(group, step, shard, common));
  FERRY_ASSIGN_OR_RETURN(const Manifest m, build_manifest(group.rank(), step, *shards, plan.layout,
                                                          parts, shard.status()));
  return commit(group, opts, step, dir, m, plan.leader);
}

Status Checkpointer::save(std::int64_t step, std::span<const SliceView> slices,
                          std::string_view common_state) {
  FERRY_RETURN_IF_ERROR(wait());
  return impl_->save(step, slices, common_state);
}

Status Checkpointer::save_async(std::int64_t step, std::span<const SliceView> slices,
                                std::string_view common_state) {
  FERRY_RETURN_IF_ERROR(wait());
  Impl& m = *impl_;
  std::uint64_t total = 0;
  for (const SliceView& v : slices) total += v.data.size();
  FERRY_RETURN_IF_ERROR(m.reserve_staging(total, false));
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

// Offline tools on node roots: list, verify, gc (what `ferry ckpt` runs).
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "base/file_util.h"
#include "base/log.h"
#include "checkpoint/format.h"
#include "checkpoint/shard_format.h"
#include "ferry/checkpoint.h"
#include "ferry/checkpoint_tools.h"

namespace ferry::checkpoint {

Result<std::vector<StepListing>> list_steps(const std::vector<std::string>& roots) {
  if (roots.empty()) return invalid_argument("no checkpoint root given");
  std::set<std::int64_t> steps, latest;
  for (const std::string& root : roots) {
    std::error_code ec;
    if (!std::filesystem::is_directory(root, ec)) {
      return not_found("checkpoint root " + root + " is not a folder");
    }
    for (std::int64_t s : format::list_step_folders(root)) steps.insert(s);
    if (auto l = format::read_latest(root)) latest.insert(*l);
  }
  std::vector<StepListing> out;
  for (std::int64_t step : steps) {
    StepListing l;
    l.step = step;
    l.latest = latest.count(step) > 0;
    for (const std::string& root : roots) {
      l.roots.push_back(format::scan_step(root, step));
      if (l.roots.back().committed) l.state = StepState::kCommitted;
    }
    out.push_back(std::move(l));
  }
  return out;
}

Result<VerifyReport> verify(const std::vector<std::string>& roots, std::optional<std::int64_t> step,
                            std::function<void(std::uint64_t, std::uint64_t)> progress) {
  auto listing = list_steps(roots);
  if (!listing.ok()) return listing.status();
  const StepListing* chosen = nullptr;
  for (const StepListing& l : *listing) {
    if (step ? l.step == *step : l.state == StepState::kCommitted) chosen = &l;
  }
  if (chosen == nullptr) {
    return not_found(step ? "no step_" + std::to_string(*step) + " folder under the roots given"
                          : std::string("no committed checkpoint under the roots given"));
  }
  VerifyReport report;
  report.step = chosen->step;
  // The manifest: the first root whose copy decodes; the others must match it.
  std::optional<Manifest> manifest;
  std::string manifest_text;
  for (const NodeStepState& ns : chosen->roots) {
    const std::string path =
        format::step_path(ns.root, report.step) + "/" + std::string(format::kManifestFile);
    if (!ns.manifest) {
      report.problems.push_back({ns.node, path, "", "manifest.json is missing on this node"});
      continue;
    }
    auto text = read_file(path);
    auto m = text.ok() ? format::decode_manifest(*text, path) : Result<Manifest>(text.status());
    if (!m.ok()) {
      report.problems.push_back({ns.node, path, "", m.status().to_string()});
    } else if (!manifest) {
      manifest = std::move(*m);
      manifest_text = *text;
    } else if (*text != manifest_text) {
      report.problems.push_back({ns.node, path, "", "differs from the manifest on another node"});
    }
  }
  if (!manifest && !report.problems.empty()) return report;  // says why per root
  if (!manifest) {
    return not_found("step " + std::to_string(report.step) +
                     " has no readable manifest on the roots given");
  }
  auto shards = shard_format_for(manifest->shard_format);  // decoding checked the name
  if (!shards.ok()) return shards.status();
  // Which root holds which node; files are looked for on their node's root.
  std::map<std::string, std::string> root_of;
  for (const NodeStepState& ns : chosen->roots) {
    std::string node = ns.node;
    if (node.empty()) {
      for (const SavedFile& f : manifest->files) {
        if (format::file_exists(format::step_path(ns.root, report.step) + "/" + f.file))
          node = f.node;
      }
    }
    if (!node.empty() && !root_of.count(node)) root_of[node] = ns.root;
    if (!ns.committed) {
      report.notes.push_back("root " + ns.root + (node.empty() ? "" : " (node " + node + ")") +
                             " has no COMMITTED marker for step " + std::to_string(report.step) +
                             (ns.node_marker ? "" : " and no node marker"));
    }
  }
  std::uint64_t total = 0, done = 0;
  for (const SavedTensor& t : manifest->tensors)
    for (const SavedSlice& s : t.slices)
      if (root_of.count(manifest->layout.rank_nodes[s.rank])) total += s.bytes;
  for (const std::string& node : manifest->layout.nodes) {
    auto r = root_of.find(node);
    if (r == root_of.end()) {
      report.notes.push_back("node " + node + ": no root given, its files were not checked");
      continue;
    }
    std::vector<std::string> missing;
    const std::string dir = format::step_path(r->second, report.step);
    for (const SavedFile& f : manifest->files) {
      if (f.node != node) continue;
      const std::string path = dir + "/" + f.file;
      if (!format::file_exists(path)) {
        missing.push_back(f.file);
        continue;
      }
      // Slices of this file, in the manifest's order.
      std::vector<ManifestSlice> slices;
      for (const SavedTensor& t : manifest->tensors)
        for (const SavedSlice& s : t.slices)
          if (s.file == f.file) slices.push_back({&t, &s});
      const ShardCheck check = (*shards)->verify(path, f, slices, [&](std::uint64_t bytes) {
        done += bytes;
        if (progress) progress(done, total);
      });
      for (const ShardCheck::Problem& p : check.problems) {
        report.problems.push_back({node, path, p.tensor, p.message});
      }
      report.slices_checked += check.slices_checked;
      report.bytes_checked += check.bytes_checked;
    }
    report.missing_by_node.emplace_back(node, std::move(missing));
  }
  return report;
}

Result<std::vector<GcAction>> gc(const std::vector<std::string>& roots, bool dry_run, bool force) {
  auto listing = list_steps(roots);
  if (!listing.ok()) return listing.status();
  std::vector<GcAction> out;
  // Leftovers of a gc that crashed between its rename and its removal.
  for (const std::string& root : roots) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(".gc.step_", 0) != 0) continue;
      GcAction a{root, format::parse_ferry_step_folder(name.substr(4)).value_or(-1), !dry_run,
                 "left over by an interrupted gc"};
      if (!dry_run) std::filesystem::remove_all(e.path(), ec);
      out.push_back(std::move(a));
    }
  }
  for (const StepListing& l : *listing) {
    if (l.state == StepState::kCommitted) continue;  // committed somewhere: never removed here
    // Nodes of the saved layout (when a manifest tells) that no root given covers.
    std::set<std::string> covered, layout_nodes;
    bool any_marker = false;
    for (const NodeStepState& ns : l.roots) {
      if (!ns.node.empty()) covered.insert(ns.node);
      any_marker = any_marker || ns.node_marker;
      if (ns.manifest && layout_nodes.empty()) {
        if (auto m = format::read_manifest(ns.root, l.step); m.ok()) {
          layout_nodes.insert(m->layout.nodes.begin(), m->layout.nodes.end());
        }
      }
    }
    std::vector<std::string> unseen;
    for (const std::string& n : layout_nodes)
      if (!covered.count(n)) unseen.push_back(n);
    for (const NodeStepState& ns : l.roots) {
      const std::string dir = format::step_path(ns.root, l.step);
      if (!format::file_exists(dir)) continue;
      GcAction a{ns.root, l.step, false, ""};
      if (any_marker && !unseen.empty() && !force) {
        std::string nodes;
        for (const std::string& n : unseen) nodes += (nodes.empty() ? "" : ", ") + n;
        a.reason = "partial here, but its node markers are written and node(s) " + nodes +
                   " were not checked: it may be committed there (pass their roots, or --force)";
        out.push_back(std::move(a));
        continue;
      }
      a.reason = ns.node_marker ? "partial: no node committed it"
                 : ns.manifest  ? "partial: no node marker"
                                : "partial: no manifest";
      if (!dry_run) {
        // Rename first, so a crash mid-removal never leaves a half-deleted step_<N>.
        const std::string doomed = ns.root + "/.gc." + format::step_folder(l.step);
        std::error_code ec;
        std::filesystem::rename(dir, doomed, ec);
        if (ec) return errno_status("rename", dir, ec.value());
        std::filesystem::remove_all(doomed, ec);
        if (ec) return errno_status("remove", doomed, ec.value());
        a.removed = true;
      }
      out.push_back(std::move(a));
    }
  }
  return out;
}

}  // namespace ferry::checkpoint

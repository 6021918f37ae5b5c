// ferry ckpt: ferry's sharded checkpoints on node-local roots (ls, verify, gc,
// and a single-process save/load that simulates a sharded job).
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/progress.h"
#include "ferry/checkpoint.h"
#include "ferry/checkpoint_tools.h"

namespace ferry::cli {
namespace {

namespace ck = ferry::checkpoint;
using json = nlohmann::ordered_json;

struct CkptArgs {
  std::vector<std::string> roots;
  std::string from, to;
  std::optional<std::int64_t> step;
  int ranks = 4;
  int nodes = 2;
  bool json = false;
  bool dry_run = false;
  bool force = false;
};

// A negative --step is a usage error, never "the default".
std::optional<Status> bad_step(const CkptArgs& a) {
  if (a.step && *a.step < 0) {
    return invalid_argument("--step must be 0 or more, got " + std::to_string(*a.step));
  }
  return std::nullopt;
}

std::optional<std::int64_t> step_of(const CkptArgs& a) { return a.step; }

int run_ls(const CkptArgs& a) {
  const auto roots = ck::expand_roots(a.roots);
  auto listing = ck::list_steps(roots);
  if (!listing.ok()) return report_error(listing.status());
  if (a.json) {
    json steps = json::array();
    for (const ck::StepListing& l : *listing) {
      json per = json::array();
      for (const ck::NodeStepState& n : l.roots) {
        per.push_back({{"root", n.root},
                       {"node", n.node},
                       {"manifest", n.manifest},
                       {"node_marker", n.node_marker},
                       {"committed", n.committed},
                       {"files", n.files}});
      }
      steps.push_back({{"step", l.step},
                       {"state", l.state == ck::StepState::kCommitted ? "committed" : "partial"},
                       {"latest", l.latest},
                       {"roots", per}});
    }
    std::cout << json{{"roots", roots}, {"steps", steps}}.dump(2) << "\n";
    return kExitOk;
  }
  if (listing->empty()) {
    std::printf("no checkpoints under %zu root(s)\n", roots.size());
    return kExitOk;
  }
  for (const ck::StepListing& l : *listing) {
    std::printf("step %lld  %s%s\n", static_cast<long long>(l.step),
                l.state == ck::StepState::kCommitted ? "committed" : "partial",
                l.latest ? "  (latest)" : "");
    for (const ck::NodeStepState& n : l.roots) {
      std::string state = n.committed       ? "committed"
                          : n.node_marker   ? "node marker, no COMMITTED"
                          : n.manifest      ? "manifest, no node marker"
                          : n.files.empty() ? "absent"
                                            : "shards only";
      std::printf("  %-10s %-28s %zu shard file(s)  %s\n", n.node.empty() ? "?" : n.node.c_str(),
                  state.c_str(), n.files.size(), n.root.c_str());
    }
  }
  return kExitOk;
}

int run_verify(const CkptArgs& a) {
  if (auto bad = bad_step(a)) return usage_error(*bad);
  if (auto rc = run_megatron_verify(a.roots, step_of(a), a.json)) return *rc;  // verl/Megatron
  const auto roots = ck::expand_roots(a.roots);
  ProgressBar bar("verify");
  auto report =
      ck::verify(roots, step_of(a), [&bar](std::uint64_t d, std::uint64_t t) { bar.update(d, t); });
  if (!report.ok()) return report_error(report.status());
  bool missing = false;
  for (const auto& [node, files] : report->missing_by_node) missing |= !files.empty();
  const bool ok = report->problems.empty() && !missing;
  if (a.json) {
    json problems = json::array();
    for (const ck::VerifyProblem& p : report->problems) {
      problems.push_back(
          {{"node", p.node}, {"file", p.file}, {"tensor", p.tensor}, {"message", p.message}});
    }
    json miss = json::object();
    for (const auto& [node, files] : report->missing_by_node) miss[node] = files;
    std::cout << json{{"step", report->step},
                      {"ok", ok},
                      {"slices_checked", report->slices_checked},
                      {"bytes_checked", report->bytes_checked},
                      {"problems", problems},
                      {"missing_by_node", miss},
                      {"notes", report->notes}}
                     .dump(2)
              << "\n";
  } else {
    for (const ck::VerifyProblem& p : report->problems) {
      std::printf("PROBLEM node %s: %s%s%s: %s\n", p.node.empty() ? "?" : p.node.c_str(),
                  p.file.c_str(), p.tensor.empty() ? "" : " tensor ", p.tensor.c_str(),
                  p.message.c_str());
    }
    for (const auto& [node, files] : report->missing_by_node) {
      for (const std::string& f : files)
        std::printf("MISSING node %s: %s\n", node.c_str(), f.c_str());
    }
    for (const std::string& n : report->notes) std::printf("note: %s\n", n.c_str());
    std::printf("step %lld: %s (%llu slices, %s checked)\n", static_cast<long long>(report->step),
                ok ? "OK" : "FAILED", static_cast<unsigned long long>(report->slices_checked),
                format_bytes(report->bytes_checked).c_str());
  }
  return ok ? kExitOk : kExitFailure;
}

int run_gc(const CkptArgs& a) {
  const auto roots = ck::expand_roots(a.roots);
  auto actions = ck::gc(roots, a.dry_run, a.force);
  if (!actions.ok()) return report_error(actions.status());
  if (a.json) {
    json out = json::array();
    for (const ck::GcAction& x : *actions) {
      out.push_back(
          {{"root", x.root}, {"step", x.step}, {"removed", x.removed}, {"reason", x.reason}});
    }
    std::cout << json{{"dry_run", a.dry_run}, {"actions", out}}.dump(2) << "\n";
    return kExitOk;
  }
  for (const ck::GcAction& x : *actions) {
    std::printf("%s step %lld in %s: %s\n",
                x.removed ? "removed" : (a.dry_run ? "would remove" : "kept"),
                static_cast<long long>(x.step), x.root.c_str(), x.reason.c_str());
  }
  if (actions->empty()) std::printf("nothing to remove\n");
  return kExitOk;
}

int run_save(const CkptArgs& a) {
  if (a.roots.size() != 1) return usage_error(invalid_argument("save takes one ROOT_PREFIX"));
  if (auto bad = bad_step(a)) return usage_error(*bad);
  ck::FolderSaveOptions o;
  o.ranks = a.ranks;
  o.nodes = a.nodes;
  o.step = step_of(a);
  auto step = [&] {  // the bar's line ends before the summary is printed
    ProgressBar bar("save");
    o.progress = [&bar](std::uint64_t d, std::uint64_t t) { bar.update(d, t); };
    return ck::save_model_folder(a.from, a.roots[0], o);
  }();
  if (!step.ok()) return report_error(step.status());
  if (a.json) {
    json roots = json::array();
    for (int n = 0; n < a.nodes; ++n) roots.push_back(a.roots[0] + "/node" + std::to_string(n));
    std::cout
        << json{{"step", *step}, {"ranks", a.ranks}, {"nodes", a.nodes}, {"roots", roots}}.dump(2)
        << "\n";
  } else {
    std::printf("saved %s as step %lld: %d ranks on %d nodes under %s/node0..node%d\n",
                a.from.c_str(), static_cast<long long>(*step), a.ranks, a.nodes, a.roots[0].c_str(),
                a.nodes - 1);
  }
  return kExitOk;
}

int run_load(const CkptArgs& a) {
  if (auto bad = bad_step(a)) return usage_error(*bad);
  const auto roots = ck::expand_roots(a.roots);
  ck::FolderLoadOptions o;
  o.step = step_of(a);
  o.overwrite = a.force;
  auto info = [&] {  // the bar's line ends before the summary is printed
    ProgressBar bar("load");
    o.progress = [&bar](std::uint64_t d, std::uint64_t t) { bar.update(d, t); };
    return ck::load_model_folder(roots, a.to, o);
  }();
  if (!info.ok()) return report_error(info.status());
  std::uint64_t bytes = 0;
  for (const ck::SavedTensor& t : info->manifest.tensors) {
    std::uint64_t n = 1;
    for (std::int64_t d : t.shape) n *= static_cast<std::uint64_t>(d);
    bytes += n * static_cast<std::uint64_t>(dtype_bits(t.dtype)) / 8;
  }
  if (a.json) {
    std::cout << json{{"step", info->step},
                      {"to", a.to},
                      {"tensors", info->manifest.tensors.size()},
                      {"bytes", bytes},
                      {"notes", info->notes}}
                     .dump(2)
              << "\n";
  } else {
    for (const std::string& n : info->notes) std::printf("note: %s\n", n.c_str());
    std::printf("loaded step %lld (%zu tensors, %s) into %s/model.safetensors\n",
                static_cast<long long>(info->step), info->manifest.tensors.size(),
                format_bytes(bytes).c_str(), a.to.c_str());
  }
  return kExitOk;
}

// Adds `ckpt <name>` running `run` on `args`, with the two arguments it shares with the other
// subcommands that read node roots: ROOT... and --json. The caller adds the rest.
CLI::App* add_roots_command(CLI::App& ckpt, Dispatch& dispatch, const std::string& name,
                            const std::string& description, const std::string& example,
                            const std::shared_ptr<CkptArgs>& args, int (*run)(const CkptArgs&)) {
  CLI::App* c =
      add_command(ckpt, dispatch, name, description, example, [args, run] { return run(*args); });
  c->add_option("ROOT", args->roots,
                "Node roots, or a folder holding them (e.g. ckpt/ for ckpt/node0, ckpt/node1)")
      ->required();
  c->add_flag("--json", args->json, "Print JSON");
  return c;
}

}  // namespace

void add_ckpt_command(CLI::App& app, Dispatch& dispatch) {
  CLI::App* ckpt = app.add_subcommand(
      "ckpt", "ferry's sharded checkpoints on node-local storage (docs/checkpoint.md)");
  ckpt->require_subcommand(1);

  add_roots_command(*ckpt, dispatch, "ls",
                    "List checkpoint steps and their state (committed / partial) per node",
                    "ferry ckpt ls /tmp/ckpt", std::make_shared<CkptArgs>(), run_ls);

  auto ver = std::make_shared<CkptArgs>();
  CLI::App* c = add_roots_command(
      *ckpt, dispatch, "verify",
      "Re-hash every slice of a step; name file and tensor on a mismatch and list expected files "
      "missing per node (exit 1 on any problem). On verl/Megatron folders: per node, the "
      "metadata files missing or inconsistent",
      "ferry ckpt verify /tmp/ckpt --step 3", ver, run_verify);
  c->add_option("--step", ver->step,
                "Step to verify (default: newest committed; verl/Megatron: every complete step)");

  auto g = std::make_shared<CkptArgs>();
  c = add_roots_command(*ckpt, dispatch, "gc",
                        "Remove partial checkpoints (never a committed one); give every node's "
                        "root so a step committed elsewhere is recognised",
                        "ferry ckpt gc /tmp/ckpt --dry-run", g, run_gc);
  c->add_flag("--dry-run", g->dry_run, "Report what would be removed");
  c->add_flag(
      "--force", g->force,
      "Also remove partial steps whose other nodes were not given (they may be committed there)");

  auto sv = std::make_shared<CkptArgs>();
  c = add_command(*ckpt, dispatch, "save",
                  "Save a Hugging Face folder as a sharded checkpoint: --ranks ranks (threads) on "
                  "--nodes node roots ROOT_PREFIX/node<i>, each tensor split along dim 0",
                  "ferry ckpt save --from /tmp/qwen --ranks 4 --nodes 2 /tmp/ckpt",
                  [sv] { return run_save(*sv); });
  c->add_option("ROOT_PREFIX", sv->roots, "Folder for the node roots")->required();
  c->add_option("--from", sv->from, "Hugging Face model folder")->required();
  c->add_option("--ranks", sv->ranks, "Ranks")->capture_default_str();
  c->add_option("--nodes", sv->nodes, "Nodes (rank r on node r*nodes/ranks)")
      ->capture_default_str();
  c->add_option("--step", sv->step, "Step number (default: one past the newest)");
  c->add_flag("--json", sv->json, "Print JSON");

  auto ld = std::make_shared<CkptArgs>();
  c = add_roots_command(*ckpt, dispatch, "load",
                        "Reassemble a checkpoint (one rank per node root) into a Hugging Face "
                        "folder: model.safetensors and config.json",
                        "ferry ckpt load /tmp/ckpt --to /tmp/qwen-restored", ld, run_load);
  c->add_option("--to", ld->to,
                "Output folder, built beside it and renamed into place (must be absent or empty "
                "unless --force)")
      ->required();
  c->add_option("--step", ld->step, "Step to load (default: newest committed)");
  c->add_flag(
      "--force", ld->force,
      "Replace a non-empty --to folder as a whole (its other files, e.g. tokenizer, go too)");

  add_ckpt_verl_commands(*ckpt, dispatch);
}

}  // namespace ferry::cli

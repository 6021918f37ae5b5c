// Offline tools on the node roots of ferry's own checkpoint format (what `ferry ckpt ls,
// verify, gc, save, load` run): list the steps, re-hash a step, remove partial ones, and the
// single-process helpers that save a Hugging Face folder as a sharded checkpoint and load one
// back (docs/checkpoint.md). For verl / Megatron folders see ferry/megatron.h.
//
//   auto steps = ferry::checkpoint::list_steps({"/n0/ckpt", "/n1/ckpt"});
//   auto report = ferry::checkpoint::verify({"/n0/ckpt", "/n1/ckpt"});
//
// Thread safety: the functions share no state.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/export.h"
#include "ferry/status.h"

namespace ferry::checkpoint {

// ---------------------------------------------------------------------------
// Offline tools on one or more node roots (what `ferry ckpt` runs).

enum class StepState { kCommitted, kPartial };

struct NodeStepState {
  std::string root;
  std::string node;  // from its marker or shard files; "" when unknown
  bool manifest = false;
  bool node_marker = false;
  bool committed = false;
  std::vector<std::string> files;  // shard files present
};
struct StepListing {
  std::int64_t step = 0;
  StepState state = StepState::kPartial;  // committed on at least one root
  std::vector<NodeStepState> roots;       // one per root given, in order
  bool latest = false;                    // some root's `latest` names it
};
// Every step_<N> folder of the given roots, by step.
FERRY_EXPORT Result<std::vector<StepListing>> list_steps(const std::vector<std::string>& roots);

struct VerifyProblem {
  std::string node;
  std::string file;
  std::string tensor;  // "" when the problem is the whole file
  std::string message;
};
struct VerifyReport {
  std::int64_t step = 0;
  std::uint64_t slices_checked = 0;
  std::uint64_t bytes_checked = 0;
  std::vector<VerifyProblem> problems;  // empty: everything matches
  // Per node of the saved layout: expected files missing on the roots given.
  std::vector<std::pair<std::string, std::vector<std::string>>> missing_by_node;
  std::vector<std::string> notes;
};
// Re-hashes every slice of `step` (default: newest committed) found on the
// roots; reports files missing per node (nodes without a root given are skipped
// and named in notes). `progress` gets (bytes done, bytes total).
FERRY_EXPORT Result<VerifyReport> verify(
    const std::vector<std::string>& roots, std::optional<std::int64_t> step = std::nullopt,
    std::function<void(std::uint64_t, std::uint64_t)> progress = {});

struct GcAction {
  std::string root;
  std::int64_t step = 0;
  bool removed = false;
  std::string reason;
};
// Removes partial checkpoints, never the newest committed one. A partial step
// with a node marker whose layout has nodes not among `roots` may be committed
// there, so it is kept unless `force`. `dry_run` reports without removing.
FERRY_EXPORT Result<std::vector<GcAction>> gc(const std::vector<std::string>& roots,
                                              bool dry_run = false, bool force = false);

// ---------------------------------------------------------------------------
// Single-process helpers for `ferry ckpt save|load` (a simulated sharded job).

// Command-line roots: an argument that holds step_<N> folders or `latest` is a
// root; otherwise each such folder directly inside it is one (sorted by name),
// so "ckpt/" finds "ckpt/node0", "ckpt/node1". An argument with neither stays as given.
FERRY_EXPORT std::vector<std::string> expand_roots(const std::vector<std::string>& args);

// (bytes done, bytes total) of the tensor data, from any thread, one call at a time.
using FolderProgress = std::function<void(std::uint64_t done, std::uint64_t total)>;

struct FolderSaveOptions {
  int ranks = 4;
  int nodes = 2;                     // rank r is on node r * nodes / ranks, root <prefix>/node<i>
  std::optional<std::int64_t> step;  // default: one past the newest step under the roots
  FolderProgress progress;
};
// Saves a Hugging Face folder as `ranks` ranks (threads) over `nodes` node roots
// under `root_prefix`, each tensor split along dim 0 (scalars on rank 0), with
// config.json and the tensor order as the common state. Returns the step.
// A config.json that is not valid JSON is a corruption error naming it; a negative
// step is invalid_argument.
FERRY_EXPORT Result<std::int64_t> save_model_folder(const std::string& hf_folder,
                                                    const std::string& root_prefix,
                                                    const FolderSaveOptions& options);

struct FolderLoadOptions {
  std::optional<std::int64_t> step;  // default: the newest committed step
  // An out_folder that exists and is not empty is refused (already_exists) unless
  // set; then it is replaced as a whole (files the checkpoint does not hold go too).
  bool overwrite = false;
  FolderProgress progress;
};
// Loads a checkpoint from its node roots (one rank per root) and writes the
// whole tensors as one model.safetensors (+ config.json when the checkpoint
// holds one) as `out_folder`. The folder is built beside it as
// .<name>.tmp.<pid> and renamed into place when complete, so a failed or killed
// load leaves out_folder as it was; temp folders of processes that are gone are
// removed by the next load. Returns what prepare_load() said.
FERRY_EXPORT Result<LoadInfo> load_model_folder(const std::vector<std::string>& roots,
                                                const std::string& out_folder,
                                                const FolderLoadOptions& options = {});

}  // namespace ferry::checkpoint

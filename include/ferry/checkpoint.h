// Sharded checkpoints on node-local storage (docs/checkpoint-format.md).
//
// Every rank of a group writes its own slices of the global tensors to its node's
// local root; the manifest (every tensor, its global shape, which rank/file/byte
// offset holds which slice, XXH3-64 checksums, the common state, the parallel
// layout) is written on EVERY node before anything is committed; then a per-node
// marker, a global COMMITTED marker and the `latest` pointer, in that order:
//
//   ferry::checkpoint::Checkpointer ckpt(group, {.root = "/local/ckpt"});
//   ckpt.save(step, my_slices, R"({"lr": 1e-5})");     // or save_async(...); wait()
//   auto info = ckpt.prepare_load();                     // newest committed step
//   ckpt.load(my_destinations);                          // any layout, bit-exact
//
// Loading may use another layout (ranks, nodes, split dimensions): local slices
// are read from this node's disk, the others fetched from a rank whose node has
// them through RankGroup::fetch. A crash at any point of a save leaves the
// previous checkpoint loadable and the new one detectable as partial (ls, gc).
//
// The ranks' group is ferry/rank_group.h; the offline tools (ls, verify, gc) and the
// Hugging Face folder helpers are ferry/checkpoint_tools.h.
//
// Thread safety: a Checkpointer and its RankGroup are used by one thread at a
// time (an async save's background thread counts as the caller until wait()).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/rank_group.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::checkpoint {

inline constexpr int kFormatVersion = 1;

// ---------------------------------------------------------------------------
// Slices.

// A box of a global tensor: offset and extent per dimension. The slice's bytes
// are row-major over `extent` (as if the box were a tensor of its own).
struct FERRY_EXPORT SliceSpec {
  std::string name;  // the global tensor's name
  DType dtype = DType::kBF16;
  std::vector<std::int64_t> global_shape;
  std::vector<std::int64_t> offset;  // same length as global_shape
  std::vector<std::int64_t> extent;

  // The whole tensor as one slice.
  static SliceSpec whole(std::string name, DType dtype, std::vector<std::int64_t> shape);
  // Rows [begin, begin + count) of dimension `dim`, the rest whole.
  static SliceSpec along(std::string name, DType dtype, std::vector<std::int64_t> shape, int dim,
                         std::int64_t begin, std::int64_t count);
  // Checks dims, bounds, overflow; byte-sized dtypes only for partial slices.
  Status validate() const;
  std::uint64_t bytes() const;  // REQUIRES: validate() passed
  // "name[0:512, 0:1536]"
  std::string to_string() const;
};

struct SliceView {
  SliceSpec spec;
  std::span<const std::byte> data;  // REQUIRES: data.size() == spec.bytes()
};
struct MutableSliceView {
  SliceSpec spec;
  std::span<std::byte> data;
};

// ---------------------------------------------------------------------------
// What a checkpoint holds (the manifest, as loaders see it).

struct SavedSlice {
  int rank = 0;
  std::string file;  // shard file, relative to the step folder
  std::string tensor_in_file;
  std::vector<std::int64_t> offset, extent;
  std::uint64_t data_offset = 0;  // absolute byte offset of the slice in `file`
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;
};
struct SavedTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<std::int64_t> shape;
  std::vector<SavedSlice> slices;  // replicas (identical boxes) may repeat
};
struct SavedFile {
  std::string file;
  int rank = 0;
  std::string node;
  std::uint64_t bytes = 0;  // the file's size
};
struct Layout {
  int world_size = 0;
  int ranks_per_node = 0;               // the most ranks on one node
  std::vector<std::string> nodes;       // in order of first rank
  std::vector<std::string> rank_nodes;  // node of each rank
};
struct FERRY_EXPORT Manifest {
  int version = kFormatVersion;
  // How the shard files are written: "safetensors", the only format so far (a manifest
  // without "shard_format" means it; decoding refuses a name this ferry does not know).
  std::string shard_format = "safetensors";
  std::int64_t step = 0;
  Layout layout;
  std::string common_state;          // JSON text
  std::vector<SavedTensor> tensors;  // sorted by name
  std::vector<SavedFile> files;      // by rank

  const SavedTensor* find(std::string_view name) const;
};

// ---------------------------------------------------------------------------
// Collective save and load.

struct CheckpointOptions {
  // This node's local checkpoint root (created if missing). Ranks with the same
  // node name must pass the same root.
  std::string root;
  // Bytes of host staging for save_async(), allocated and faulted in when the
  // Checkpointer is made, so even the first async save copies into warm memory.
  // 0: allocated by the first save_async() (which then pays the page faults).
  std::uint64_t staging_bytes = 0;
  // Called with the bytes of each slice as save() writes it to this rank's shard, and
  // of each piece as load() places it in a destination. load() calls it from two
  // threads (disk and fetch) at once: it must be thread-safe. Empty: not called.
  std::function<void(std::uint64_t bytes)> progress;
};

struct LoadInfo {
  std::int64_t step = 0;
  Manifest manifest;
  // Things a user should hear about: e.g. "node n2 has no manifest for step 4;
  // fetched it from rank 0". Every rank gets every rank's notes; each rank logs
  // its own at info level.
  std::vector<std::string> notes;
};

struct LoadStats {
  std::uint64_t local_bytes = 0;   // copied from this node's disk
  std::uint64_t remote_bytes = 0;  // fetched from peers
};

class FERRY_EXPORT Checkpointer {
 public:
  // `group` must outlive the Checkpointer.
  Checkpointer(RankGroup& group, CheckpointOptions options);
  ~Checkpointer();  // waits for an async save in flight
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective. Writes this rank's slices (at most one per tensor; identical
  // boxes on several ranks are replicas) and commits step `step` on every node.
  // `common_state` is JSON text, the same on every rank (rank 0's is kept).
  // Returns after `latest` names the step on every node. already_exists if the
  // step is committed on this node; a partial one of the same step is replaced.
  Status save(std::int64_t step, std::span<const SliceView> slices,
              std::string_view common_state = "{}");
  // Like save(), but returns once the slices are copied to host staging (kept
  // between saves, so later ones copy into warm memory); the writing and the
  // commit continue on a background thread. First waits for a previous async
  // save and returns its error, if it failed (then nothing new is started).
  Status save_async(std::int64_t step, std::span<const SliceView> slices,
                    std::string_view common_state = "{}");
  // Waits for an async save in flight; its status (OK if none).
  Status wait();

  // Collective. Chooses `step` (default: the newest step committed on any node),
  // makes sure every rank has its manifest (fetched from a peer when this node
  // has none) and finds which ranks can read which shard files locally.
  Result<LoadInfo> prepare_load(std::optional<std::int64_t> step = std::nullopt);
  // Collective, after prepare_load(). Fills each destination with its box of the
  // saved tensor; every saved slice used is checked against its XXH3 first.
  // Serves this node's shards to the other ranks until every rank is done.
  Result<LoadStats> load(std::span<const MutableSliceView> destinations);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Checks one path read from a manifest: relative, no "." or ".." component, no
// empty component, no NUL or backslash. invalid_argument names `what` and the path.
FERRY_EXPORT Status validate_relative_path(std::string_view path, std::string_view what);

}  // namespace ferry::checkpoint

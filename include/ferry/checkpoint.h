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
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::checkpoint {

inline constexpr int kFormatVersion = 1;

// ---------------------------------------------------------------------------
// Rank group: how the ranks of one save or load coordinate.

// What a collective save or load needs from the ranks' transport. Every
// collective call (all_gather, broadcast, barrier) must be made by every rank,
// in the same order. Implementations: connect_local_group() (threads or
// processes on one machine, UNIX-domain sockets) and connect_net_group()
// (ranks on any machines, UCX with token authentication).
class FERRY_EXPORT RankGroup {
 public:
  virtual ~RankGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The name of this rank's node; ranks with the same name share a local root.
  // A path component: letters, digits, '.', '_', '-' (checked at group creation).
  virtual const std::string& node() const = 0;

  // Every rank's `mine`, indexed by rank.
  virtual Result<std::vector<std::string>> all_gather(std::string_view mine) = 0;
  // `data` of rank `root`; the others' `data` is ignored.
  virtual Result<std::string> broadcast(std::string_view data, int root) = 0;
  virtual Status barrier() = 0;

  // Point-to-point: sends `request` to rank `peer`, whose handler answers it.
  // Not collective; any number may be in flight from different threads.
  virtual Result<std::string> fetch(int peer, std::string_view request) = 0;
  // Like fetch(), but the answer must be exactly out.size() bytes and lands in
  // `out` without a copy in between where the transport allows. The default
  // calls fetch() and copies.
  virtual Status fetch_into(int peer, std::string_view request, std::span<std::byte> out);

  // A handler's answer: bytes it owns, or bytes it borrows (from a mapped shard)
  // that `keep_alive` keeps valid until they are sent.
  struct FetchReply {
    std::string owned;
    std::span<const std::byte> borrowed;
    std::shared_ptr<const void> keep_alive;
    std::span<const std::byte> bytes() const {
      return borrowed.data() != nullptr
                 ? borrowed
                 : std::span<const std::byte>(reinterpret_cast<const std::byte*>(owned.data()),
                                              owned.size());
    }
  };
  // Installs (or, with an empty function, removes) the handler that answers
  // other ranks' fetches. Called on server threads, possibly concurrently.
  using FetchHandler = std::function<Result<FetchReply>(int from, std::string_view request)>;
  virtual void set_fetch_handler(FetchHandler handler) = 0;
};

struct LocalGroupOptions {
  // Rank 0 listens here, the others connect: "@name" is an abstract UNIX socket
  // (nothing on disk, gone with the process, but another user can bind it first);
  // "name" (no '/') a socket in this user's private 0700 directory
  // ($XDG_RUNTIME_DIR/ferry, else /tmp/ferry-<uid>); a path with '/' that socket file.
  // A taken address fails with kAlreadyExists naming the holder's pid and uid. Rank 0
  // drops, with a warning, connections from another user (SO_PEERCRED) and ones that
  // say nothing, each of which has until `timeout` to speak beside the others.
  std::string root_address;
  int rank = 0;
  int size = 1;
  std::string node = "node0";
  // How long to wait for every rank to join, and for a peer to answer a fetch.
  // A dead peer is seen at once anyway (socket EOF); timeouts catch hung ones.
  std::chrono::milliseconds timeout{120'000};
  // How long a collective waits for the slowest rank: long, because ranks reach
  // a save's barriers after writing shards of very different sizes.
  std::chrono::milliseconds collective_timeout{1'800'000};
};

// Joins a group of ranks that are threads or processes on this machine. Each
// "node" is just a name with its own root folder, so tests model several nodes
// without shared storage. Blocks until all `size` ranks joined.
FERRY_EXPORT Result<std::unique_ptr<RankGroup>> connect_local_group(
    const LocalGroupOptions& options);

struct NetGroupOptions {
  // "host:port" (or "[v6]:port") that rank 0 listens on and every other rank
  // connects to, as torch's MASTER_ADDR:MASTER_PORT. Rank 0 stops listening
  // once every rank joined.
  std::string root_address;
  int rank = 0;
  int size = 1;
  std::string node = "node0";
  // Where this rank serves fetches, "host:port"; port 0 takes an ephemeral port.
  // A wildcard host (0.0.0.0 or [::]) listens on every interface and is
  // advertised to the others as the address rank 0 saw this rank connect from
  // (for rank 0: the host of root_address). Name one interface to pin it.
  std::string serve_address = "0.0.0.0:0";
  // The session secret every rank must share. "": FERRY_TOKEN, else the file
  // named by FERRY_TOKEN_FILE (which must have mode 0600 or 0400); with none of
  // them connect_net_group() fails. Never logged.
  std::string token;
  // How long to wait for every rank to join, and for a peer to answer a fetch.
  // A dead peer is seen at once anyway (UCX endpoint error); timeouts catch hung ones.
  std::chrono::milliseconds timeout{120'000};
  // How long a collective waits for the slowest rank (see LocalGroupOptions).
  std::chrono::milliseconds collective_timeout{1'800'000};
};

// Joins a group of ranks on any machines through UCX (docs/transport-net.md):
// TCP here, RDMA where the cluster has it. Every connection is authenticated
// with the token first; a peer with another token is refused and both sides
// name each other (rank 0 keeps waiting for the real rank, so a stranger cannot
// break the join; its timeout error lists whom it refused). Nothing assumes a
// shared filesystem. Blocks until all `size` ranks joined.
//
// Collectives go through rank 0 as in the local group. Fetch answers travel as
// UCX bulk transfers straight into the caller's buffer; each rank answers them
// on a thread of its own, so a rank serves while it waits in a collective.
// Fetches and collectives from this rank are carried out one at a time (callers
// on several threads take turns). When a rank dies, a collective fails on every
// rank with aborted naming it, at once; a fetch from it fails likewise. After a
// collective failed the group is broken: every later collective returns that
// error. The handler set by set_fetch_handler() runs on the serving thread, one
// request at a time; set_fetch_handler() returns once no call of the previous
// handler is running.
FERRY_EXPORT Result<std::unique_ptr<RankGroup>> connect_net_group(const NetGroupOptions& options);

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

// Checks one path read from a manifest: relative, no "." or ".." component, no
// empty component, no NUL or backslash. invalid_argument names `what` and the path.
FERRY_EXPORT Status validate_relative_path(std::string_view path, std::string_view what);

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

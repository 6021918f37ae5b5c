// Tools for checkpoint folders written by verl's Megatron backend and Megatron-LM, on
// node-local (non-shared) storage (docs/checkpoint.md, "verl / Megatron folders").
//
// Such a folder, as verl writes it (trainer.default_local_dir):
//
//   DIR/latest_checkpointed_iteration.txt      the tracker: "N", written by rank 0 last
//   DIR/global_step_N/actor/dist_ckpt/         one Megatron torch_dist folder per role
//       common.pt  .metadata  metadata.json    written by rank 0 only: its node alone has them
//       __<rank>_<i>.distcp                    each rank's shards, on that rank's node
//
// (newer verl nests them as actor/{model,optimizer,extra}/dist_ckpt; Megatron-LM names step
// folders iter_0000100). Every other node fails to resume without the three metadata files
// and the tracker; these tools find what is missing and copy it over the net transport (or,
// between two processes of one node, shm: an address "@name"):
//
//   auto report = ferry::checkpoint::verify_megatron({"/n0/ckpt", "/n1/ckpt"});
//   ferry::checkpoint::serve_replicas({.root = "/ckpt", .address = "0.0.0.0:7000"});  // rank 0's
//   node ferry::checkpoint::pull_replicas({.root = "/ckpt", .from = "node0:7000"});         // the
//   others
//
// The same server and puller also move an arbitrary set of files whose sizes and XXH3s the
// puller already knows (file-set mode: ReplicateServeOptions::offer, ReplicatePullOptions::
// only), e.g. the shard files of a torch.distributed.checkpoint on other nodes.
//
// The `megatron` module (src/megatron/); the names stay in namespace ferry::checkpoint.
// validate_relative_path() is in ferry/checkpoint.h, expand_roots() in ferry/checkpoint_tools.h.
//
// Thread safety: the functions share no state; serve_replicas() and pull_replicas() each
// run their own transports (net: its own context) on the calling thread until they return.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"

namespace ferry::checkpoint {

// The tracker verl's trainer and Megatron-LM write at the top of the folder.
inline constexpr std::string_view kMegatronTracker = "latest_checkpointed_iteration.txt";
// The files Megatron's rank 0 writes into each torch_dist folder, in the order it writes them:
// metadata.json last, so a folder with it is a finished save.
inline constexpr std::string_view kMegatronCommon = "common.pt";
inline constexpr std::string_view kMegatronDcpMetadata = ".metadata";
inline constexpr std::string_view kMegatronConfig = "metadata.json";

// ---------------------------------------------------------------------------
// Scanning one node's folder.

// One Megatron torch_dist folder: a folder inside a step folder that holds any of the three
// metadata files or a *.distcp shard.
struct FERRY_EXPORT DistCheckpointFolder {
  std::string path;  // relative to the root, e.g. "global_step_5/actor/dist_ckpt"
  bool common_pt = false;
  bool dcp_metadata = false;        // .metadata
  bool config = false;              // metadata.json
  std::vector<std::string> shards;  // "__0_0.distcp", ... (sorted)
  // Metadata files present but unusable: {"metadata.json", "not valid JSON: ..."}.
  std::vector<std::pair<std::string, std::string>> problems;

  bool complete() const { return common_pt && dcp_metadata && config && problems.empty(); }
  // The metadata files this folder lacks ("common.pt", ...), in Megatron's write order.
  std::vector<std::string> missing() const;
};

struct FERRY_EXPORT MegatronStep {
  std::int64_t step = 0;
  std::string folder;  // "global_step_5" (verl) or "iter_0000005" (Megatron-LM)
  std::vector<DistCheckpointFolder> dist_folders;  // sorted by path
  // At least one torch_dist folder, and every one complete.
  bool complete() const;
};

struct FERRY_EXPORT MegatronFolder {
  std::string root;
  bool tracker_present = false;
  std::optional<std::int64_t> tracker;  // the step the tracker names, when it reads as one
  std::string tracker_problem;          // why a present tracker does not ("empty", ...)
  std::vector<MegatronStep> steps;      // by step

  const MegatronStep* find(std::int64_t step) const;
};

// Whether `dir` is a verl / Megatron checkpoint folder: it holds the tracker or a
// global_step_<N> / iter_<N> folder.
FERRY_EXPORT bool is_megatron_folder(const std::string& dir);
// Command-line roots, as expand_roots() does for ferry's own format: an argument that is a
// verl / Megatron folder is a root; otherwise each such folder directly inside it is one
// (sorted by name), so "ckpt/" finds "ckpt/node0", "ckpt/node1". Empty when no argument
// is or holds one.
FERRY_EXPORT std::vector<std::string> expand_megatron_roots(const std::vector<std::string>& args);

// Reads the tracker and every step folder of `root`: not_found if it is not a folder.
// Never follows a symbolic link below the root.
FERRY_EXPORT Result<MegatronFolder> scan_megatron_folder(const std::string& root);

// ---------------------------------------------------------------------------
// What a node that has the metadata gives to the others.

struct ReplicaFile {
  std::string path;  // relative to the root
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;  // XXH3-64 of the contents
};
struct ReplicaSet {
  std::optional<std::int64_t> tracker;  // the tracker's step, when the tracker is offered
  std::vector<ReplicaFile> files;       // by step, then path; the tracker last
  std::vector<std::string> notes;       // why something is held back
};
// The files `root` offers: common.pt, .metadata and metadata.json of every torch_dist folder
// of each complete step at or below the step the tracker names, then the tracker once the
// step it names is complete. A step above the tracker (a save in progress; verl and Megatron
// write the tracker after the save) or one with a folder lacking metadata.json (Megatron
// writes it last) is held back and said so in `notes`. No tracker: nothing is offered.
FERRY_EXPORT Result<ReplicaSet> replica_set(const std::string& root);

// XXH3-64 of the contents of the file at `path` (symbolic links followed), read in 8 MiB
// pieces: a file of many GB is never whole in memory. Errors name the path (not_found when
// it is missing, io_error when a read fails).
FERRY_EXPORT Result<std::uint64_t> xxh3_file(const std::string& path);

// ---------------------------------------------------------------------------
// Verifying the folders of several nodes.

struct MegatronFileProblem {
  std::string file;  // relative to the root
  std::string message;
};
struct MegatronNodeReport {
  std::string root;
  std::string node;                  // the root's last path component, for messages
  std::vector<std::string> missing;  // expected files absent here (relative paths)
  std::vector<MegatronFileProblem> inconsistent;
  // What to run to repair this node, when verify can tell (empty otherwise): e.g. a node
  // checked without rank 0's node, which lacks the metadata only rank 0's node writes.
  std::string fix;
  bool ok() const { return missing.empty() && inconsistent.empty(); }
};
struct FERRY_EXPORT MegatronVerifyReport {
  std::optional<std::int64_t> tracker;    // the highest step a tracker names
  std::vector<std::int64_t> steps;        // the steps checked
  std::vector<MegatronNodeReport> nodes;  // one per root, in order
  std::vector<std::string> notes;
  bool ok() const;
};
// For each root (one node's folder): which expected files are missing or inconsistent.
// Expected on every node, for every step complete on some node (or only `step`): the three
// metadata files of each torch_dist folder any node has, and the tracker. Inconsistent: a
// metadata file that is empty or (metadata.json) not Megatron's JSON, a copy that differs
// from the one on the node that holds rank 0's shards, a tracker that is unreadable, names
// a step missing here or incomplete everywhere, or lags another node's.
FERRY_EXPORT Result<MegatronVerifyReport> verify_megatron(
    const std::vector<std::string>& roots, std::optional<std::int64_t> step = std::nullopt);

// ---------------------------------------------------------------------------
// Replication over the transport the address picks (docs/protocol.md, "Checkpoint
// replication"): "host:port" is net, between nodes; "@name", a name or a path is shm, between
// processes of this node (no secret: the peer must be the same user).

struct ReplicateServeOptions {
  std::string root;     // the folder whose metadata (or `offer`'s files) is given
  std::string address;  // "host:port" to listen on (port 0 picks a free one), or "@name"
  // net: the file holding the session secret (mode 0600). Empty: FERRY_TOKEN, else the file
  // FERRY_TOKEN_FILE names. Pullers must use the same secret. Unused over shm.
  std::string token_file;
  // Return after this many pullers finished a one-shot pull; 0: until `stop`.
  int clients = 0;
  // Polled at least every 50 ms; true ends serve_replicas() with OK.
  std::function<bool()> stop;
  // Called once listening, with the bound address (the real port when 0 was asked).
  std::function<void(const std::string& address)> on_listening;
  // Called for what a log would say: a peer connected, a file sent, a peer left.
  std::function<void(const std::string& event)> on_event;
  // Bytes per data message. Default 1 MiB; at most what fits a transport's message
  // (64 MiB).
  std::uint32_t chunk_bytes = 1u << 20;
  // A puller that takes none of the messages sent to it for this long is dropped and named
  // (`on_event`: "dropped <peer>: ... stopped reading"). Pullers are served side by side
  // without blocking, so a stalled one never holds up the others; a longer timeout only
  // costs the stalled one's buffered answers in memory. Default 30 s.
  std::chrono::milliseconds send_timeout{30'000};
  // File-set mode. Empty (the default): each LIST is answered with replica_set(root). Set:
  // with exactly what this returns (no tracker rule, no folder scan; its `tracker` and `notes`
  // go out as they are), called on the serving thread for every LIST. Paths are relative to
  // `root` and must pass validate_relative_path (else the LIST gets a server I/O ERROR); files
  // are read beneath `root` as in the default mode, never through a symbolic link. On each GET
  // the file is hashed again from the fd it is sent from (other pullers wait meanwhile), and
  // one whose size or XXH3 no longer match the offer gets ERROR changed; files are streamed from
  // disk a chunk at a time, so one of many GB is never whole in memory (the puller's XXH3 check
  // catches a file changed while it is sent).
  std::function<Result<ReplicaSet>()> offer;
  // Testing only: called after each data message is sent, with the file and bytes sent so far.
  std::function<void(const std::string& path, std::uint64_t sent)> test_after_chunk;
};
// Serves `root`'s replica_set() (or `offer`'s files) to pullers until `stop` or `clients`. A puller
// that fails authentication or breaks the protocol is dropped and logged; the server goes on.
// Errors: the root is not a folder, the address cannot be bound, no token (net).
FERRY_EXPORT Status serve_replicas(const ReplicateServeOptions& options);

struct PulledFile {
  std::string path;
  std::uint64_t bytes = 0;
};
struct PullRound {
  int round = 0;  // 1, 2, ...
  // The step the tracker here names after this round, when the server offered it and it was
  // written or already held (nullopt when the round ended before it).
  std::optional<std::int64_t> tracker;
  std::vector<PulledFile> copied;  // written in this round
  std::size_t unchanged = 0;       // offered files already identical here
  std::vector<std::string> notes;  // the server's reasons for holding steps back
};
struct PullResult {
  int rounds = 0;
  std::uint64_t files_copied = 0;
  std::uint64_t bytes_copied = 0;
  std::optional<std::int64_t> tracker;  // as of the last round
  std::string stopped;  // why a watch ended: "stop requested", "server ... went away"
};

struct ReplicatePullOptions {
  std::string root;        // this node's folder (created if missing); nothing is written outside it
  std::string from;        // the server's "host:port" (or "@name" on this node)
  std::string token_file;  // as ReplicateServeOptions::token_file
  // false: one round, then return. true: a round every `watch_interval` until `stop` or the
  // server goes away (both return OK).
  bool watch = false;
  // Between rounds of a watch; 10 ms to 1 h (invalid_argument outside).
  std::chrono::milliseconds watch_interval{2000};
  // For connecting, and for each answer of the server.
  std::chrono::milliseconds timeout{30'000};
  std::function<bool()> stop;  // polled at least every 50 ms
  std::function<void(const PullRound&)> on_round;
  // Bytes copied so far in this round and the round's total, as data arrives.
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;
  // File-set mode. Empty (the default): the Megatron metadata the server offers. Non-empty:
  // exactly these files, one round (`watch` must be false), no tracker. Their sizes and XXH3s
  // are the caller's, never the server's claim: every path must pass validate_relative_path
  // and appear once (invalid_argument, before connecting); a file the INDEX lacks is
  // not_found, one it offers with another size or XXH3 is corruption ("server ADDR offers F
  // with ... but the caller expects ..."), both naming the server and the file and checked for
  // every file before any is fetched. A file this folder already holds with the expected size
  // and XXH3 is not fetched (PullRound::unchanged). The others are streamed into a temp file
  // as their chunks arrive, hashed as they are written, then fsynced and renamed; bytes that
  // do not hash to the caller's XXH3, or a server that says its file changed, are corruption
  // naming the server and the file, and nothing is left at the target.
  std::vector<ReplicaFile> only;
};
// Asks the server for its replica set and copies each file this node lacks or holds with
// other contents: whole in memory, checked for size and XXH3, then into a temp file beside
// the target (created O_EXCL|O_NOFOLLOW through the folder's fd), fsynced, renamed; the tracker
// last, so it never names a step whose metadata is not in place. The tracker is written only
// for a step whose metadata the same INDEX offered in full (every offered folder of that step
// with common.pt, .metadata and metadata.json) and the INDEX named as the tracker's step: an
// INDEX that breaks this is corruption naming the server and the step, before anything is
// written; a tracker whose bytes name another step is not written and waits for the next round
// (a one-shot pull lists again, then fails saying why). Every path the server sends is
// checked before use: relative, no "." or "..", a metadata file name or the tracker, and no folder
// on the way a symbolic link (invalid_argument otherwise, before anything is written; a link
// planted later is refused as failed_precondition, one at the file's own name is replaced, never
// written through). A server that dies mid-file leaves no partial file.
// File-set mode (`only` non-empty): as `only` says instead.
FERRY_EXPORT Result<PullResult> pull_replicas(const ReplicatePullOptions& options);

}  // namespace ferry::checkpoint

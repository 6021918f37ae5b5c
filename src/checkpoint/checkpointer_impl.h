// Checkpointer's internals, shared by checkpointer.cc (save) and load.cc (load).
#pragma once

#include <sys/mman.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/file_util.h"
#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "checkpoint/format.h"
#include "checkpoint/readahead.h"
#include "checkpoint/shard_format.h"
#include "checkpoint/slice.h"
#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

inline Box box_of(const SavedSlice& s) { return {s.offset, s.extent}; }
inline Box box_of(const SliceSpec& s) { return {s.offset, s.extent}; }

// Runs `read` on rank `r`'s message of a collective. A malformed one (not JSON, a field
// missing or of the wrong type) becomes a corruption error naming the rank and `what`,
// never an exception on the caller's thread.
template <typename F>
Status read_from_rank(int r, std::string_view what, F&& read) {
  try {
    return read();
  } catch (const std::exception& e) {
    return corruption("malformed " + std::string(what) + " from rank " + std::to_string(r) + ": " +
                      e.what());
  }
}

// Runs the hook of checkpoint/testing.h, if one is set, with a save phase just completed.
void run_save_phase_hook(std::string_view phase);

// Every rank learns whether every rank succeeded: the first failure (by rank)
// is returned to all, so no rank goes on to commit what another could not write.
Status agree(RankGroup& group, const Status& mine, std::string_view phase);

// The shard files a load has opened, and which of their slices matched their XXH3.
struct ShardFileCache {
  Mutex mu;
  CondVar done;  // a slice left `verifying`
  std::map<std::string, std::shared_ptr<const ShardReader>> files FERRY_GUARDED_BY(mu);
  // "file\0tensor" of slices whose XXH3 matched
  std::set<std::string> verified FERRY_GUARDED_BY(mu);
  // Being hashed now: others wait rather than hash again.
  std::set<std::string> verifying FERRY_GUARDED_BY(mu);
};

// A saved slice's bytes on this node's disk, checked against the manifest's XXH3; `file`
// keeps them readable.
struct CheckedSlice {
  std::shared_ptr<const ShardReader> file;
  std::span<const std::byte> bytes;
};

// What one load knows, shared with the fetch handler's server threads.
struct LoadState {
  std::int64_t step = 0;
  Manifest manifest;
  const ShardFormat* shards = nullptr;                 // the manifest's format
  std::map<std::string, std::vector<int>> file_ranks;  // ranks that can read a file locally
  std::set<std::string> local_files;
  ShardFileCache cache;
  // Set by prepare_load: verifies one slice ahead of its use (errors are left to the
  // reader, who verifies again).
  std::function<void(SliceReadahead::Key)> verify_ahead;
  // One worker per shard file, so each file is read as one sequential stream and a
  // rank that both reads a file and serves another reads both at once.
  // Declared last: destroyed (workers stopped) before what they read.
  Mutex readahead_mu;
  std::map<std::string, std::unique_ptr<SliceReadahead>> readahead FERRY_GUARDED_BY(readahead_mu);

  // Has slice `i` of `t` (a tensor of `manifest`) verified ahead if its file is on
  // this node.
  void read_ahead(const SavedTensor& t, std::size_t i) {
    if (!verify_ahead || i >= t.slices.size() || !local_files.count(t.slices[i].file)) return;
    MutexLock lock(readahead_mu);
    auto& worker = readahead[t.slices[i].file];
    if (!worker) worker = std::make_unique<SliceReadahead>(verify_ahead);
    worker->hint({static_cast<std::size_t>(&t - manifest.tensors.data()), i});
  }
};

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
      return errno_status("mmap", "checkpoint staging of " + std::to_string(bytes) + " bytes",
                          errno);
    }
    staging = MappedRegion(p, bytes);
    return ok_status();
  }

  std::shared_ptr<LoadState> load;

  Impl(RankGroup& g, CheckpointOptions o) : group(g), opts(std::move(o)) {}

  std::string step_dir(std::int64_t step) const { return format::step_path(opts.root, step); }

  Status save(std::int64_t step, std::span<const SliceView> slices, std::string_view common);

  // Load helpers (load.cc).
  Result<RankGroup::FetchReply> handle_fetch(const std::shared_ptr<LoadState>& st, int from,
                                             std::string_view request);
  // Slice `s` of `t` from its shard file on this node, once its XXH3 has matched.
  Result<CheckedSlice> open_checked(LoadState& st, const SavedTensor& t, const SavedSlice& s);
};

}  // namespace ferry::checkpoint

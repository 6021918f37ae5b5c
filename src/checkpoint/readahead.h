// SliceReadahead: reads and verifies saved slices ahead of their use during a load.
//
// A load touches each saved slice in two steps: verify (hash the whole slice, which
// reads it from disk) and use (copy a region out, or send it to a peer). Done one after
// the other, the disk idles while a slice is copied or sent, and the copy or the network
// idles while the next slice is read. The loader, and each peer that fetches from this
// rank, name the slices they will want next; a worker thread per shard file verifies
// them in that order, so reading slice i+1 overlaps using slice i. Verification is
// single-flight in the loader's cache: the worker and a request for the same slice
// hash it once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/thread_annotations.h"
#include "checkpoint/fetch_request.h"

namespace ferry::checkpoint {

// Saved bytes a reader names ahead of the slice it is using: enough to keep the disk
// busy while one large slice is copied or sent, small next to host memory.
inline constexpr std::uint64_t kReadaheadBytes = 256ull << 20;

// Walks a sequence of slices in order and names, before each, the ones after it that
// were not named yet, keeping at most `max_bytes` of saved slices and at most
// `max_entries` slices ahead of the one in use. The entry cap is the fetch request's
// (kMaxAheadHints): a window of many small slices must still fit in one request.
class AheadWindow {
 public:
  // bytes[i]: the saved bytes of the i-th slice of the walk.
  explicit AheadWindow(std::vector<std::uint64_t> bytes, std::uint64_t max_bytes = kReadaheadBytes,
                       std::size_t max_entries = kMaxAheadHints)
      : bytes_(std::move(bytes)), max_bytes_(max_bytes), max_entries_(max_entries) {}

  // The slices [first, last) to name before using slice i; call with i = 0, 1, 2, ...
  // The slice right after i is named even when it alone exceeds max_bytes.
  std::pair<std::size_t, std::size_t> advance(std::size_t i);

 private:
  std::vector<std::uint64_t> bytes_;
  std::uint64_t max_bytes_;
  std::size_t max_entries_;
  std::size_t next_ = 0;
  std::uint64_t ahead_ = 0;  // saved bytes of slices [i + 1, next_)
};

class SliceReadahead {
 public:
  // A slice: (tensor index in the manifest, slice index in that tensor).
  using Key = std::pair<std::size_t, std::size_t>;

  // `verify` runs on the worker thread, once per key, in hint order; its errors are
  // not reported here (the load that uses the slice verifies it again and reports them).
  explicit SliceReadahead(std::function<void(Key)> verify) : verify_(std::move(verify)) {}
  ~SliceReadahead();  // drops what is queued, waits for the slice in progress
  SliceReadahead(const SliceReadahead&) = delete;
  SliceReadahead& operator=(const SliceReadahead&) = delete;

  // Queues `key` unless it was queued before. The worker starts on the first hint.
  void hint(Key key);

 private:
  void run();

  std::function<void(Key)> verify_;
  Mutex mu_;
  CondVar cv_;  // a key was queued, or stop_ was set
  std::deque<Key> queue_ FERRY_GUARDED_BY(mu_);
  std::set<Key> seen_ FERRY_GUARDED_BY(mu_);  // every key ever queued: each is read ahead once
  bool stop_ FERRY_GUARDED_BY(mu_) = false;
  std::thread worker_ FERRY_GUARDED_BY(mu_);  // started by the first hint
};

}  // namespace ferry::checkpoint

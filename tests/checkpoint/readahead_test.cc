// SliceReadahead: each hinted slice is verified once, in hint order, on one worker,
// and destruction waits for the slice in progress and drops the rest. AheadWindow:
// what a reader names ahead stays within the bytes and the entries a request allows.
#include "checkpoint/readahead.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "checkpoint/fetch_request.h"

namespace ferry::checkpoint {
namespace {

using Key = SliceReadahead::Key;

TEST(SliceReadahead, VerifiesEachHintedSliceOnceInHintOrder) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Key> seen;
  std::vector<std::thread::id> threads;
  {
    SliceReadahead ra([&](Key k) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(k);
      threads.push_back(std::this_thread::get_id());
      cv.notify_all();
    });
    for (Key k : {Key{2, 0}, Key{0, 1}, Key{2, 0}, Key{1, 3}, Key{0, 1}}) ra.hint(k);
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return seen.size() == 3; }));
  }
  EXPECT_EQ(seen, (std::vector<Key>{{2, 0}, {0, 1}, {1, 3}}));
  EXPECT_NE(threads[0], std::this_thread::get_id());
  EXPECT_EQ(threads[0], threads[1]);
  EXPECT_EQ(threads[1], threads[2]);
}

TEST(SliceReadahead, DestructionWaitsForTheSliceInProgressAndDropsTheQueue) {
  std::atomic<int> started{0}, finished{0};
  std::atomic<bool> release{false};
  auto ra = std::make_unique<SliceReadahead>([&](Key) {
    ++started;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++finished;
  });
  for (std::size_t i = 0; i < 100; ++i) ra->hint({i, 0});
  while (started == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread destroy([&] { ra.reset(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  release = true;
  destroy.join();
  EXPECT_EQ(started.load(), finished.load());  // nothing runs past the destructor
  EXPECT_LT(finished.load(), 100);             // the queue was dropped, not drained
}

// Issue 15: 290 small tensors fetched from one peer named all of them ahead (the window
// was capped by bytes only) and the peer refused the request (at most kMaxAheadHints).
TEST(AheadWindow, ManySmallSlicesAreNamedAtMostMaxAheadHintsAtATime) {
  const std::size_t n = 4 * kMaxAheadHints + 3;
  AheadWindow w(std::vector<std::uint64_t>(n, 1));
  std::vector<int> named(n, 0);
  std::size_t widest = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto [first, last] = w.advance(i);
    ASSERT_LE(first, last);
    EXPECT_GT(first, i);
    EXPECT_LE(last - (i + 1), kMaxAheadHints) << "slices named ahead of " << i;
    widest = std::max(widest, last - first);
    for (std::size_t a = first; a < last; ++a) ++named[a];
  }
  EXPECT_EQ(widest, kMaxAheadHints);  // the first request is exactly at the limit
  EXPECT_EQ(named[0], 0);
  for (std::size_t a = 1; a < n; ++a) EXPECT_EQ(named[a], 1) << "slice " << a;
}

TEST(AheadWindow, TheByteCapStillHoldsAndTheNextSliceIsAlwaysNamed) {
  AheadWindow w({10, 60, 30, 30, 200, 5}, /*max_bytes=*/100, /*max_entries=*/8);
  using Range = std::pair<std::size_t, std::size_t>;
  EXPECT_EQ(w.advance(0), (Range{1, 3}));  // 60 + 30 fit, + 30 would not
  EXPECT_EQ(w.advance(1), (Range{3, 4}));  // 30 + 30 + ... 200 would not
  EXPECT_EQ(w.advance(2), (Range{4, 4}));  // 30 + 200 would not fit
  EXPECT_EQ(w.advance(3), (Range{4, 5}));  // 200 > 100, named as the next slice
  EXPECT_EQ(w.advance(4), (Range{5, 6}));
  EXPECT_EQ(w.advance(5), (Range{6, 6}));
}

TEST(AheadWindow, ASliceLargerThanTheCapIsNamedWhenItIsNext) {
  AheadWindow w({1, 500, 1}, /*max_bytes=*/100, /*max_entries=*/8);
  using Range = std::pair<std::size_t, std::size_t>;
  EXPECT_EQ(w.advance(0), (Range{1, 2}));
  EXPECT_EQ(w.advance(1), (Range{2, 3}));
}

}  // namespace
}  // namespace ferry::checkpoint

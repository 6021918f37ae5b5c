// SliceReadahead: each hinted slice is verified once, in hint order, on one worker,
// and destruction waits for the slice in progress and drops the rest.
#include "checkpoint/readahead.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

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

}  // namespace
}  // namespace ferry::checkpoint

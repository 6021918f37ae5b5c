#include "base/serving_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

namespace ferry {
namespace {

TEST(ServingThreads, RunsEachWorkOnAThreadOfItsOwn) {
  std::atomic<int> ran{0};
  std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> elsewhere{true};
  ServingThreads threads(4);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(threads.start([&] {
      if (std::this_thread::get_id() == caller) elsewhere = false;
      ++ran;
    }));
  }
  threads.join_all();
  EXPECT_EQ(ran.load(), 3);
  EXPECT_TRUE(elsewhere.load());
  EXPECT_EQ(threads.size(), 0u);
}

TEST(ServingThreads, RefusesPastItsCapAndDestroysTheWorkUnrun) {
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  ServingThreads threads(2);
  ASSERT_TRUE(threads.start([go] { go.wait(); }));
  ASSERT_TRUE(threads.start([go] { go.wait(); }));

  auto owned = std::make_shared<int>(7);  // stands for the connection the work owns
  bool ran = false;
  EXPECT_FALSE(threads.start([&ran, owned] { ran = true; }));
  EXPECT_EQ(owned.use_count(), 1) << "the refused work must be destroyed";
  EXPECT_FALSE(ran);
  EXPECT_EQ(threads.size(), 2u);

  release.set_value();
  threads.join_all();
  EXPECT_TRUE(threads.start([] {}));  // room again once they are done
}

TEST(ServingThreads, FinishedThreadsMakeRoom) {
  ServingThreads threads(1);
  ASSERT_TRUE(threads.start([] {}));
  // Its work returns at once: a later start joins that thread and takes its place.
  bool started = false;
  for (int i = 0; i < 5000 && !started; ++i) {
    started = threads.start([] {});
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(started);
  EXPECT_EQ(threads.size(), 1u);
}

TEST(ServingThreads, DestructorJoins) {
  std::atomic<bool> finished{false};
  {
    ServingThreads threads(1);
    ASSERT_TRUE(threads.start([&finished] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      finished = true;
    }));
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace ferry

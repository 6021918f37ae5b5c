#include "base/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace ferry {
namespace {

TEST(Mutex, MutexLockExcludesOtherThreads) {
  Mutex mu;
  long n = 0;  // a plain long: lost updates would show without the lock
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        MutexLock lock(mu);
        ++n;
      }
    });
  }
  for (auto& th : threads) th.join();
  MutexLock lock(mu);
  EXPECT_EQ(n, 4 * 20000);
}

TEST(Mutex, TryLockFailsWhileHeld) {
  Mutex mu;
  MutexLock lock(mu);
  bool got = true;
  std::thread([&] { got = mu.try_lock(); }).join();
  EXPECT_FALSE(got);
}

TEST(CondVar, NotifyWakesAWaiterThatHoldsTheMutexAgain) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread setter([&] {
    MutexLock lock(mu);
    ready = true;
    cv.notify_all();
  });
  {
    MutexLock lock(mu);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!ready && std::chrono::steady_clock::now() < give_up) {
      cv.wait_for(mu, std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(ready);
  }
  setter.join();
}

}  // namespace
}  // namespace ferry

// A mutex the thread-safety analysis understands (base/thread_annotations.h): std::mutex
// with capability attributes, a scoped lock, and a condition variable that waits on it.
// Not copyable or movable, like std::mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/thread_annotations.h"

namespace ferry {

class FERRY_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() FERRY_ACQUIRE() { mu_.lock(); }
  void unlock() FERRY_RELEASE() { mu_.unlock(); }
  bool try_lock() FERRY_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  std::mutex mu_;
};

// Holds `mu` from construction to the end of the scope.
class FERRY_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) FERRY_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() FERRY_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// std::condition_variable_any over a Mutex: a wait releases `mu` and holds it again before
// it returns, so the caller's view (held throughout) is what the analysis checks.
class CondVar {
 public:
  template <class Rep, class Period>
  void wait_for(Mutex& mu, std::chrono::duration<Rep, Period> timeout) FERRY_REQUIRES(mu) {
    cv_.wait_for(mu, timeout);
  }
  void wait(Mutex& mu) FERRY_REQUIRES(mu) { cv_.wait(mu); }
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace ferry

// A bounded set of threads, each serving one connection to its end. A server that gives a
// connection a thread of its own (one that blocks on that peer) must not let a flood of
// connections spawn threads without end, nor keep finished threads: this caps them, and
// joins finished ones as new ones start.
#pragma once

#include <atomic>
#include <cstddef>
#include <list>
#include <memory>
#include <thread>
#include <utility>

namespace ferry {

// Used by one thread (the server's accept loop); the work runs on threads of their own.
class ServingThreads {
 public:
  explicit ServingThreads(std::size_t max) : max_(max) {}
  ~ServingThreads() { join_all(); }
  ServingThreads(const ServingThreads&) = delete;
  ServingThreads& operator=(const ServingThreads&) = delete;

  // Runs `work()` on a thread of its own. False when `max` threads are still running:
  // then `work` is destroyed unrun (with whatever it owns, e.g. the connection).
  template <typename Work>
  bool start(Work work) {
    reap();
    if (threads_.size() >= max_) return false;
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread t([work = std::move(work), done]() mutable {
      work();
      done->store(true);
    });
    threads_.push_back({std::move(t), std::move(done)});
    return true;
  }

  // Waits for every thread started (the caller must first make their work end).
  void join_all();

  // The threads started and not yet joined (finished ones included until the next start).
  std::size_t size() const { return threads_.size(); }

 private:
  struct Entry {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void reap();  // joins the threads whose work returned

  const std::size_t max_;
  std::list<Entry> threads_;
};

}  // namespace ferry

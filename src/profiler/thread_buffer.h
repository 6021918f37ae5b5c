// Per-thread event buffers: single-producer single-consumer rings, so the
// recording thread never takes a lock. The one consumer is whoever holds the
// registry lock in drain_all().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "profiler/event.h"

namespace ferry::profiler {

class ThreadBuffer {
 public:
  ThreadBuffer(std::uint32_t tid, std::size_t capacity);

  std::uint32_t tid() const { return tid_; }

  // Producer side (the owning thread only). Returns the slot to fill, or null
  // when the ring is full (the event is counted as dropped); then call publish().
  Event* reserve() {
    const std::uint64_t h = head_.load(std::memory_order_relaxed);
    if (h - tail_.load(std::memory_order_acquire) >= slots_.size()) {
      overflowed_.store(overflowed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return nullptr;
    }
    return &slots_[h & mask_];
  }
  void publish() {
    head_.store(head_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // Consumer side: moves every published event into `out`.
  void drain(std::vector<Event>* out);
  // Events lost because the ring was full, since the last call.
  std::uint64_t take_overflowed();

  std::atomic<bool> retired{false};  // the thread exited; free once drained

 private:
  std::uint32_t tid_;
  std::vector<Event> slots_;
  std::uint64_t mask_;
  std::atomic<std::uint64_t> head_{0};
  std::atomic<std::uint64_t> tail_{0};
  std::atomic<std::uint64_t> overflowed_{0};
  std::uint64_t overflowed_seen_ = 0;
};

// The calling thread's buffer, created and registered on first use.
ThreadBuffer& this_thread_buffer();

// Drains every thread's buffer into `out` (appended, per thread in order);
// returns the ring overflows since the last drain. Thread-safe.
std::uint64_t drain_all(std::vector<Event>* out);

// Ring size for buffers created from now on (a power of two; tests use small ones).
void set_thread_buffer_capacity(std::size_t events);

}  // namespace ferry::profiler

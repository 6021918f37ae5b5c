#include "profiler/thread_buffer.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <bit>

#include "base/mutex.h"

namespace ferry::profiler {
namespace {

// Every thread's buffer. Shared ownership: a thread that exits leaves its buffer for the
// next drain.
struct Registry {
  Mutex mu;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers FERRY_GUARDED_BY(mu);
};
Registry& registry() {
  static Registry r;
  return r;
}
std::atomic<std::size_t> g_capacity{1u << 14};

struct Owner {
  std::shared_ptr<ThreadBuffer> buffer;
  ~Owner() {
    if (buffer) buffer->retired.store(true, std::memory_order_release);
  }
};

thread_local ThreadBuffer* t_buffer = nullptr;
thread_local Owner t_owner;

}  // namespace

ThreadBuffer::ThreadBuffer(std::uint32_t tid, std::size_t capacity)
    : tid_(tid), slots_(std::bit_ceil(capacity < 2 ? 2 : capacity)), mask_(slots_.size() - 1) {}

void ThreadBuffer::drain(std::vector<Event>* out) {
  const std::uint64_t t = tail_.load(std::memory_order_relaxed);
  const std::uint64_t h = head_.load(std::memory_order_acquire);
  for (std::uint64_t i = t; i < h; ++i) {
    Event& e = slots_[i & mask_];
    out->push_back(std::move(e));
    e = Event();  // the slot is reused: leave it empty, not moved-from
  }
  tail_.store(h, std::memory_order_release);
}

std::uint64_t ThreadBuffer::take_overflowed() {
  const std::uint64_t now = overflowed_.load(std::memory_order_relaxed);
  const std::uint64_t fresh = now - overflowed_seen_;
  overflowed_seen_ = now;
  return fresh;
}

ThreadBuffer& this_thread_buffer() {
  if (t_buffer != nullptr) [[likely]]
    return *t_buffer;
  auto buffer = std::make_shared<ThreadBuffer>(static_cast<std::uint32_t>(::syscall(SYS_gettid)),
                                               g_capacity.load(std::memory_order_relaxed));
  {
    Registry& r = registry();
    MutexLock lock(r.mu);
    r.buffers.push_back(buffer);
  }
  t_owner.buffer = buffer;
  t_buffer = buffer.get();
  return *t_buffer;
}

std::uint64_t drain_all(std::vector<Event>* out) {
  Registry& r = registry();
  MutexLock lock(r.mu);
  std::uint64_t overflowed = 0;
  auto& buffers = r.buffers;
  for (std::size_t i = 0; i < buffers.size();) {
    // Read retired first: a retired thread publishes nothing after it.
    const bool retired = buffers[i]->retired.load(std::memory_order_acquire);
    buffers[i]->drain(out);
    overflowed += buffers[i]->take_overflowed();
    if (retired) {
      buffers[i] = std::move(buffers.back());
      buffers.pop_back();
    } else {
      ++i;
    }
  }
  return overflowed;
}

void set_thread_buffer_capacity(std::size_t events) {
  g_capacity.store(events, std::memory_order_relaxed);
}

}  // namespace ferry::profiler

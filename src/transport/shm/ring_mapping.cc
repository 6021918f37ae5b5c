#include "transport/shm/ring_mapping.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

namespace ferry::shm {
namespace {

// Small enough that a stop request is seen within a millisecond or so.
constexpr std::uint64_t kChunkBytes = std::uint64_t{2} << 20;

// Loads once from each page of [p, p + bytes). Plain loads, not MADV_POPULATE_READ (which
// base/prefault.h adds): each fault holds the mapping's lock only for itself, so this
// low-priority thread never holds it while it waits for a CPU.
void touch_pages(const std::byte* p, std::uint64_t bytes, std::uint64_t page) {
  const auto* b = reinterpret_cast<const volatile unsigned char*>(p);
  unsigned char sink = 0;
  for (std::uint64_t off = 0; off < bytes; off += page) sink ^= b[off];
  (void)sink;
}

}  // namespace

RingMapping& RingMapping::operator=(RingMapping&& o) noexcept {
  if (this != &o) {
    stop_prefault();  // before the region it reads is unmapped
    region_ = std::move(o.region_);
    prefault_ = std::move(o.prefault_);
    prefault_pid_ = o.prefault_pid_;
  }
  return *this;
}

void RingMapping::prefault_in_background(std::uint32_t slots, std::uint64_t slot_bytes) {
  const std::byte* base = region_.data();
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  prefault_pid_ = ::getpid();
  prefault_ = std::jthread([=](std::stop_token stop) {
    // Lowest priority (this thread only): on a busy machine the round's own work goes
    // first, and pages this thread has not reached are faulted by their reader; it runs
    // while the machine is idle, as between two updates.
    (void)::setpriority(PRIO_PROCESS, 0, 19);
    for (std::uint64_t offset = 0; offset < slot_bytes; offset += kChunkBytes) {
      const std::uint64_t bytes = std::min(kChunkBytes, slot_bytes - offset);
      for (std::uint32_t s = 0; s < slots; ++s) {
        if (stop.stop_requested()) return;
        touch_pages(base + s * slot_bytes + offset, bytes, page);
      }
    }
  });
}

void RingMapping::wait_prefaulted() {
  if (prefault_.joinable() && ::getpid() == prefault_pid_) prefault_.join();
}

void RingMapping::stop_prefault() {
  if (!prefault_.joinable()) return;
  if (::getpid() != prefault_pid_) {
    prefault_.detach();  // a forked child: the thread is its parent's; joining it is undefined
    return;
  }
  prefault_.request_stop();
  prefault_.join();
}

}  // namespace ferry::shm

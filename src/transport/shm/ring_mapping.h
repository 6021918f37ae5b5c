// One process's mapping of a ring, with the thread (if any) that faults its pages in.
//
// A receiver's first read of each ring page is a fault of its own, once per mapping (on a
// VM whose hypervisor shadows guest page tables, ~1 s per GiB even after
// MADV_POPULATE_READ). Faulting them in at join delays the join by that much; faulting them
// in a background thread lets the join return at once, and the first round's reads find
// most pages ready: a page the thread has not reached yet is faulted by the reader itself.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <thread>

#include "base/file_util.h"

namespace ferry::shm {

class RingMapping {
 public:
  RingMapping() = default;
  explicit RingMapping(MappedRegion region) : region_(std::move(region)) {}
  // Stops the prefault thread before the region is unmapped (in a forked child, which has
  // no such thread, leaves it).
  ~RingMapping() { stop_prefault(); }
  RingMapping(RingMapping&&) noexcept = default;
  RingMapping& operator=(RingMapping&& o) noexcept;

  std::byte* data() const { return region_.data(); }

  // Starts a thread that faults every page in for reading (a load from each), in the order
  // buckets fill slots: the first 2 MiB of every slot, then the next 2 MiB of every slot,
  // and so on. REQUIRES: the region is slots x slot_bytes; no thread was started yet.
  void prefault_in_background(std::uint32_t slots, std::uint64_t slot_bytes);
  // Waits for the prefault thread to finish (tests, benchmarks).
  void wait_prefaulted();

 private:
  void stop_prefault();

  MappedRegion region_;
  std::jthread prefault_;   // reads region_: stopped and joined before region_ is unmapped
  pid_t prefault_pid_ = 0;  // the process that started it (a forked child has no such thread)
};

}  // namespace ferry::shm

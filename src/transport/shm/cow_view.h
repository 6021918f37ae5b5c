// A writable, copy-on-write view of a ring that this process may only read.
//
// Receivers map the ring read-only (MemfdRing), so no receiver can write what another reads.
// A caller that wants to write into the tensors it was handed (verl's receive contract)
// gets them from this second mapping instead: MAP_PRIVATE from the same fd. Reads share the
// ring's pages (no copy); the first write to a page gives this process a private copy of
// that page only, and the ring, the sender and every other receiver still see the
// original. A private mapping never writes the file, so the kernel allows it on the
// read-only fd of a ring sealed with F_SEAL_FUTURE_WRITE.
//
// A page written once stays private, and so stale when the sender refills its slot:
// forget_writes() drops the written pages of a slot before its next bucket is handed out,
// after which they read the ring again.
#pragma once

#include <cstdint>
#include <vector>

#include "base/file_util.h"
#include "ferry/status.h"
#include "transport/ring.h"
#include "transport/shm/ring_mapping.h"

namespace ferry::shm {

class CowView final : public transport::WritableView {
 public:
  CowView() = default;
  CowView(CowView&&) noexcept = default;
  CowView& operator=(CowView&&) noexcept = default;

  // Maps `ring_fd` (slots x slot_bytes, opened read-only or not) privately and writable,
  // and faults its pages in for reading from a background thread, so round 1 need not
  // (RingMapping). Errors name the mmap call that the kernel refused.
  static Result<CowView> map(int ring_fd, std::uint32_t slots, std::uint64_t slot_bytes);

  bool mapped() const { return region_.data() != nullptr; }
  // REQUIRES: mapped(), i < slots. Writable; reads the ring until written.
  std::byte* slot(std::uint32_t i) const override { return region_.data() + i * slot_bytes_; }

  // Drops every page of slot i this process wrote, so the slot shows the ring's bytes
  // again. Finds them in /proc/self/pagemap (a written page is no longer a file page), so
  // clean pages stay mapped; where pagemap cannot be read, drops the whole slot (correct,
  // but each page then faults in again). REQUIRES: no view of slot i is in use. Calls for
  // different slots may run at once, on different threads (a receiver scans one slot in the
  // background while it hands out views of the other).
  Status forget_writes(std::uint32_t i) override;

  // Slot i's views read-only (their lease ended: a late write faults instead of changing
  // what later rounds show), or writable again (new views are handed out).
  Status seal(std::uint32_t i) override { return protect(i, false); }
  Status unseal(std::uint32_t i) override { return protect(i, true); }

  // Pages forget_writes() dropped so far (tests and benchmarks); not while one runs.
  std::uint64_t pages_dropped() const;
  // Waits until the view's pages are faulted in (tests, benchmarks).
  void wait_prefaulted() { region_.wait_prefaulted(); }

 private:
  Status drop(std::uint32_t i, std::byte* from, std::size_t bytes);
  Status protect(std::uint32_t i, bool writable);

  RingMapping region_;
  ScopedFd pagemap_;  // /proc/self/pagemap; invalid where it cannot be opened
  std::uint64_t slot_bytes_ = 0;
  // Pages dropped per slot: each call writes only its own slot's count, so calls for
  // different slots may run at once.
  std::vector<std::uint64_t> dropped_;
};

}  // namespace ferry::shm

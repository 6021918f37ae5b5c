// A ring of K equal slots in one anonymous memfd: the bulk path of the shm transport.
//
// memfd, not shm_open: the memory has no name in /dev/shm, so a kill -9 of any
// process leaks nothing; it lives exactly as long as some process holds the fd
// or a mapping. The sender creates and pre-faults it once per Sender;
// receivers get a read-only fd over SCM_RIGHTS and map it read-only. After the
// creator maps it, the ring is sealed with F_SEAL_FUTURE_WRITE: no process,
// even one that reopens the memfd read-write through /proc, can write() it or
// map it writable again, so a faulty receiver cannot corrupt what others read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/file_util.h"
#include "ferry/status.h"
#include "transport/ring.h"
#include "transport/shm/ring_mapping.h"

namespace ferry::shm {

class MemfdRing final : public transport::Ring {
 public:
  MemfdRing() = default;
  MemfdRing(MemfdRing&&) noexcept = default;
  MemfdRing& operator=(MemfdRing&&) noexcept = default;

  // A ring of `slots` x `slot_bytes`, writable through slot() here only: sealed against
  // resizing and against new writes or writable mappings, and pre-faulted.
  static Result<MemfdRing> create(std::uint32_t slots, std::uint64_t slot_bytes);
  // Maps a ring received from `peer` read-only, after checking its seals and size, and
  // faults its pages in from a background thread, so round 1 need not (RingMapping).
  static Result<MemfdRing> map_readonly(ScopedFd fd, std::uint32_t slots, std::uint64_t slot_bytes,
                                        const std::string& peer);
  // Copies into.size() bytes at `offset` of a memfd `peer` passed into `into` (pread: no
  // mapping, so no page faults). Only a memfd sealed against resizing is read: a read of it
  // never blocks, and its size cannot change under the read.
  static Status read_passed(int fd, std::uint64_t offset, std::span<std::byte> into,
                            const std::string& peer);

  int fd() const { return fd_.get(); }
  // Creator only: the ring opened O_RDONLY, the descriptor to pass to receivers.
  int reader_fd() const { return reader_fd_.get(); }
  int share_fd() const override { return reader_fd(); }
  // A copy-on-write mapping of the memfd (CowView), on the creator or a reader.
  Result<std::unique_ptr<transport::WritableView>> writable_view() const override;
  // Waits until a mapped ring's pages are faulted in (tests, benchmarks).
  void wait_prefaulted() { region_.wait_prefaulted(); }

 private:
  ScopedFd fd_;
  ScopedFd reader_fd_;
  RingMapping region_;
};

// A ring just made or mapped, owned through the interface (what Transport::allocate_ring and
// map_peer_ring answer).
inline Result<std::unique_ptr<transport::Ring>> boxed_ring(Result<MemfdRing> ring) {
  if (!ring.ok()) return ring.status();
  return std::unique_ptr<transport::Ring>(std::make_unique<MemfdRing>(std::move(*ring)));
}

}  // namespace ferry::shm

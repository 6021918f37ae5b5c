// A ring of K equal slots in one anonymous memfd: the bulk path of the shm transport.
//
// memfd, not shm_open: the memory has no name in /dev/shm, so a kill -9 of any
// process leaks nothing; it lives exactly as long as some process holds the fd
// or a mapping. The sender creates and pre-faults it once per session;
// receivers get the fd over SCM_RIGHTS and map it read-only, so a faulty
// receiver cannot corrupt what other receivers read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/file_util.h"
#include "ferry/status.h"

namespace ferry::shm {

class MemfdRing {
 public:
  MemfdRing() = default;
  MemfdRing(MemfdRing&&) noexcept = default;
  MemfdRing& operator=(MemfdRing&&) noexcept = default;

  // A writable ring of `slots` x `slot_bytes`, sealed against resizing and pre-faulted.
  static Result<MemfdRing> create(std::uint32_t slots, std::uint64_t slot_bytes);
  // Maps a ring received from `peer` read-only, after checking its seals and size.
  static Result<MemfdRing> map_readonly(ScopedFd fd, std::uint32_t slots, std::uint64_t slot_bytes,
                                        const std::string& peer);

  int fd() const { return fd_.get(); }
  std::uint32_t slots() const { return slots_; }
  std::uint64_t slot_bytes() const { return slot_bytes_; }
  // REQUIRES: i < slots(). Writable only on the ring's creator.
  std::byte* slot(std::uint32_t i) const { return region_.data() + i * slot_bytes_; }

 private:
  ScopedFd fd_;
  MappedRegion region_;
  std::uint32_t slots_ = 0;
  std::uint64_t slot_bytes_ = 0;
};

}  // namespace ferry::shm

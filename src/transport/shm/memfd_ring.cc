#include "transport/shm/memfd_ring.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "base/prefault.h"
#include "transport/shm/cow_view.h"

namespace ferry::shm {
namespace {

// Without F_SEAL_SHRINK the creator could truncate the file under a reader's mapping
// and kill it with SIGBUS.
constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;
// Added once the creator holds its writable mapping: from then on write(), fallocate()
// hole punching and every new PROT_WRITE shared mapping (or mprotect to it) fail for
// every process, so only the creator's mapping writes the ring.
constexpr int kRequiredSeals = kSizeSeals | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;

Result<std::uint64_t> ring_size(std::uint32_t slots, std::uint64_t slot_bytes) {
  std::uint64_t size = 0;
  if (slots == 0 || slot_bytes == 0 || __builtin_mul_overflow(slot_bytes, slots, &size) ||
      size > (std::uint64_t{1} << 46)) {
    return invalid_argument(
        fmt::format("a ring of {} slots of {} bytes is not valid", slots, slot_bytes));
  }
  return size;
}

}  // namespace

Result<MemfdRing> MemfdRing::create(std::uint32_t slots, std::uint64_t slot_bytes) {
  auto size = ring_size(slots, slot_bytes);
  if (!size.ok()) return size.status();
  MemfdRing ring;
  ring.fd_.reset(::memfd_create("ferry-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!ring.fd_.valid()) return errno_status("memfd_create", "ferry-ring", errno);
  if (::ftruncate(ring.fd_.get(), static_cast<off_t>(*size)) != 0) {
    return errno_status("ftruncate", fmt::format("ferry-ring ({} bytes)", *size), errno);
  }
  if (::fcntl(ring.fd_.get(), F_ADD_SEALS, kSizeSeals) != 0) {
    return errno_status("fcntl(F_ADD_SEALS)", "ferry-ring", errno);
  }
  void* addr = ::mmap(nullptr, *size, PROT_READ | PROT_WRITE, MAP_SHARED, ring.fd_.get(), 0);
  if (addr == MAP_FAILED) return errno_status("mmap", "ferry-ring", errno);
  ring.region_ = RingMapping(MappedRegion(addr, *size));
  // Backed once per session (a store per page), so the first round does not pay for it:
  // MAP_POPULATE alone left the first round's copies into the ring ~15x slower.
  prefault_writable(addr, *size);
  if (::fcntl(ring.fd_.get(), F_ADD_SEALS, kRequiredSeals) != 0) {
    return errno_status("fcntl(F_ADD_SEALS F_SEAL_FUTURE_WRITE)", "ferry-ring", errno);
  }
  // Receivers get this one: O_RDONLY, so mmap(PROT_WRITE, MAP_SHARED) is refused even
  // before the seal is looked at.
  const std::string self = fmt::format("/proc/self/fd/{}", ring.fd_.get());
  ring.reader_fd_.reset(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ring.reader_fd_.valid()) return errno_status("open(O_RDONLY)", self, errno);
  ring.set_slots(ring.region_.data(), slots, slot_bytes);
  return ring;
}

Result<MemfdRing> MemfdRing::map_readonly(ScopedFd fd, std::uint32_t slots,
                                          std::uint64_t slot_bytes, const std::string& peer) {
  auto size = ring_size(slots, slot_bytes);
  if (!size.ok()) return size.status().with_context("ring from " + peer);
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) return errno_status("fcntl(F_GET_SEALS)", "ring from " + peer, errno);
  if ((seals & kRequiredSeals) != kRequiredSeals) {
    return failed_precondition(fmt::format(
        "ring from {} is not sealed against resizing and writing (seals {:#x}, need {:#x})", peer,
        seals, kRequiredSeals));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status("fstat", "ring from " + peer, errno);
  if (static_cast<std::uint64_t>(st.st_size) < *size) {
    return corruption(
        fmt::format("ring from {} has {} bytes, WELCOME promised {}", peer, st.st_size, *size));
  }
  void* addr = ::mmap(nullptr, *size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (addr == MAP_FAILED) return errno_status("mmap", "ring from " + peer, errno);
  MemfdRing ring;
  ring.fd_ = std::move(fd);
  ring.region_ = RingMapping(MappedRegion(addr, *size));
  // Not in round 1: this process's first read of each ring page is a fault of its own
  // (MAP_POPULATE alone left round 1 ~3x round 2 on a PVM guest). Nor at join, which it
  // would delay by ~1 s per GiB on such a guest: beside it.
  ring.region_.prefault_in_background(slots, slot_bytes);
  ring.set_slots(ring.region_.data(), slots, slot_bytes);
  return ring;
}

Status MemfdRing::read_passed(int fd, std::uint64_t offset, std::span<std::byte> into,
                              const std::string& peer) {
  const std::string what = "memory passed by " + peer;
  const int seals = ::fcntl(fd, F_GET_SEALS);  // fails on anything but a memfd
  if (seals < 0) return errno_status("fcntl(F_GET_SEALS)", what, errno);
  if ((seals & kSizeSeals) != kSizeSeals) {
    return failed_precondition(
        fmt::format("{} is not sealed against resizing (seals {:#x})", what, seals));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status("fstat", what, errno);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (offset > size || into.size() > size - offset) {
    return corruption(fmt::format("{} has {} bytes, less than the {} at offset {} to read", what,
                                  size, into.size(), offset));
  }
  for (std::size_t done = 0; done < into.size();) {
    const ssize_t n =
        ::pread(fd, into.data() + done, into.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("pread", what, errno);
    if (n == 0) return corruption(fmt::format("{} ended at byte {}", what, offset + done));
    done += static_cast<std::size_t>(n);
  }
  return ok_status();
}

Result<std::unique_ptr<transport::WritableView>> MemfdRing::writable_view() const {
  auto view = CowView::map(fd(), slots(), slot_bytes());
  if (!view.ok()) return view.status();
  return std::unique_ptr<transport::WritableView>(std::make_unique<CowView>(std::move(*view)));
}

}  // namespace ferry::shm

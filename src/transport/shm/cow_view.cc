#include "transport/shm/cow_view.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <numeric>
#include <vector>

#include "base/status_macros.h"

namespace ferry::shm {
namespace {

// /proc/self/pagemap: one 64-bit entry per virtual page (Documentation/admin-guide/mm/pagemap.rst).
constexpr std::uint64_t kPresent = std::uint64_t{1} << 63;
constexpr std::uint64_t kSwapped = std::uint64_t{1} << 62;
// "file page or shared-anon": set while the private mapping still shows the ring's page,
// clear once a write gave this process its own copy.
constexpr std::uint64_t kFilePage = std::uint64_t{1} << 61;
constexpr std::size_t kEntriesPerRead = 64 * 1024;  // 256 MiB of 4 KiB pages per pread

bool written(std::uint64_t entry) {
  return (entry & (kPresent | kSwapped)) != 0 && (entry & kFilePage) == 0;
}

std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

}  // namespace

Result<CowView> CowView::map(int ring_fd, std::uint32_t slots, std::uint64_t slot_bytes) {
  // forget_writes() drops whole pages: one shared by two slots could take back writes the
  // caller made into the other slot's views, which are still in use.
  if (slots == 0 || slot_bytes == 0 || slot_bytes % page_size() != 0) {
    return failed_precondition(
        fmt::format("writable views need a bucket size that is a multiple of the page size "
                    "({} bytes); the ring's buckets are {} bytes",
                    page_size(), slot_bytes));
  }
  const std::size_t size = std::size_t{slots} * slot_bytes;
  void* addr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, ring_fd, 0);
  if (addr == MAP_FAILED) {
    return errno_status("mmap(MAP_PRIVATE, PROT_WRITE)", "the ring's copy-on-write view", errno);
  }
  CowView view;
  // A read maps the ring's page (no copy); forget_writes() may drop pages meanwhile: they
  // read the ring again either way.
  view.region_ = RingMapping(MappedRegion(addr, size));
  view.region_.prefault_in_background(slots, slot_bytes);
  view.slot_bytes_ = slot_bytes;
  view.dropped_.assign(slots, 0);
  view.pagemap_.reset(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  return view;
}

Status CowView::forget_writes(std::uint32_t i) {
  std::byte* const begin = slot(i);
  if (!pagemap_.valid()) return drop(i, begin, slot_bytes_);
  const std::size_t page = page_size();
  const std::size_t pages = slot_bytes_ / page;
  const std::uint64_t first_page = reinterpret_cast<std::uintptr_t>(begin) / page;
  std::byte* run_start = nullptr;  // the written pages not yet dropped: [run_start, run_end)
  std::byte* run_end = nullptr;
  std::vector<std::uint64_t> entries;  // per call: calls for other slots may run at once
  for (std::size_t done = 0; done < pages;) {
    const std::size_t n = std::min(kEntriesPerRead, pages - done);
    entries.resize(n);
    const off_t at = static_cast<off_t>((first_page + done) * sizeof(std::uint64_t));
    const ssize_t got = ::pread(pagemap_.get(), entries.data(), n * sizeof(std::uint64_t), at);
    if (got != static_cast<ssize_t>(n * sizeof(std::uint64_t))) {
      return drop(i, begin, slot_bytes_);  // pagemap refused (or came short): drop them all
    }
    for (std::size_t k = 0; k < n; ++k) {
      if (!written(entries[k])) continue;
      std::byte* p = begin + (done + k) * page;
      if (p != run_end) {
        if (run_start != nullptr) FERRY_RETURN_IF_ERROR(drop(i, run_start, run_end - run_start));
        run_start = p;
      }
      run_end = p + page;
    }
    done += n;
  }
  if (run_start != nullptr) return drop(i, run_start, run_end - run_start);
  return ok_status();
}

Status CowView::protect(std::uint32_t i, bool writable) {
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  if (::mprotect(slot(i), slot_bytes_, prot) != 0) {
    return errno_status(writable ? "mprotect(PROT_WRITE)" : "mprotect(PROT_READ)",
                        "the ring's copy-on-write view", errno);
  }
  return ok_status();
}

std::uint64_t CowView::pages_dropped() const {
  return std::accumulate(dropped_.begin(), dropped_.end(), std::uint64_t{0});
}

Status CowView::drop(std::uint32_t i, std::byte* from, std::size_t bytes) {
  // On a private file mapping, the next touch of a dropped page reads the file again.
  if (::madvise(from, bytes, MADV_DONTNEED) != 0) {
    return errno_status("madvise(MADV_DONTNEED)", "the ring's copy-on-write view", errno);
  }
  dropped_[i] += bytes / page_size();
  return ok_status();
}

}  // namespace ferry::shm

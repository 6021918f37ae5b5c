// The defaults of a receiver's memory bounds (ReceiverOptions in ferry/sync.h), from this
// machine's memory.
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "ferry/sync.h"

namespace ferry::sync {

std::uint64_t receiver_memory_limit(std::uint64_t cap, std::uint64_t physical_bytes) {
  if (physical_bytes == 0) return cap;  // unknown: the fixed cap, as before
  const std::uint64_t floor = std::min<std::uint64_t>(1ull << 30, physical_bytes / 2);
  return std::min(cap, std::max(floor, physical_bytes / 4));
}

std::uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size);
}

std::uint64_t receiver_memory_limit(std::uint64_t cap) {
  return receiver_memory_limit(cap, physical_memory_bytes());
}

}  // namespace ferry::sync

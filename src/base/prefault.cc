#include "base/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace ferry {

void prefault_writable(void* p, std::size_t bytes) {
  if (p == nullptr || bytes == 0) return;
#ifdef MADV_POPULATE_WRITE
  // Linux 5.14+: the kernel faults the pages in without a fault per page. The stores
  // below still happen: this maps the pages, it does not make the hypervisor back them.
  (void)::madvise(p, bytes, MADV_POPULATE_WRITE);
#endif
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  auto* b = static_cast<volatile unsigned char*>(p);
  // Rewrites the byte it reads, so memory that holds data keeps it.
  for (std::size_t off = 0; off < bytes; off += page) b[off] = b[off];
}

void prefault_readable(const void* p, std::size_t bytes) {
  if (p == nullptr || bytes == 0) return;
#ifdef MADV_POPULATE_READ
  (void)::madvise(const_cast<void*>(p), bytes, MADV_POPULATE_READ);
#endif
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto* b = static_cast<const volatile unsigned char*>(p);
  unsigned char sink = 0;
  for (std::size_t off = 0; off < bytes; off += page) sink ^= b[off];
  (void)sink;
}

}  // namespace ferry

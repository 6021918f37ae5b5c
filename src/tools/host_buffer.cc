#include "tools/host_buffer.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "base/prefault.h"

namespace ferry::tools {

Result<MappedRegion> map_anonymous(std::uint64_t bytes, bool dont_fork, bool prefault) {
  if (bytes == 0) return MappedRegion();
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return errno_status("mmap", fmt::format("{} bytes", bytes), errno);
  MappedRegion r(p, bytes);
  if (dont_fork) (void)::madvise(p, bytes, MADV_DONTFORK);
  if (prefault) prefault_writable(p, bytes);
  return r;
}

std::vector<TensorView> lay_out(const std::vector<TensorSpec>& specs, const std::byte* base) {
  std::vector<TensorView> views;
  views.reserve(specs.size());
  std::uint64_t off = 0;
  for (const TensorSpec& s : specs) {
    views.push_back({s, {base + off, s.bytes()}});
    off += s.bytes();
  }
  return views;
}

}  // namespace ferry::tools

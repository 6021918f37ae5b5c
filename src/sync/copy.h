// The one copy routine of the sync path (sender packing, receiver unpacking).
#pragma once

#include <cstddef>

namespace ferry::sync {

// Copies n bytes. Copies of at least kStreamingCopyBytes use non-temporal stores:
// glibc switches to them only above __x86_shared_non_temporal_threshold, so the
// 1-64 MiB pieces of a bucket otherwise go through the cache (read-for-ownership on
// every destination line, then write-back), which costs ~40% of the bandwidth.
// docs/benchmarks.md has the measurements.
void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n);

inline constexpr std::size_t kStreamingCopyBytes = 1u << 20;

}  // namespace ferry::sync

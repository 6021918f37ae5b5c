// The runs encoding: for each maximal stretch of changed bytes, (gap since the previous
// run's end, length, the new bytes), gap and length as LEB128 varints. Byte granularity, so
// any dtype and odd lengths work, and a bf16 element whose low byte alone changed costs one
// payload byte; runs separated by at most kMaxMergedGap equal bytes are merged, since a new
// run's two varints would cost as much as the bytes between.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::delta {

inline constexpr std::size_t kMaxMergedGap = 2;

// Appends the runs of `current` against `previous` to `out` and returns their number.
// Stops and returns false once the appended bytes would pass `cap`.
bool encode_runs(std::span<const std::byte> previous, std::span<const std::byte> current,
                 std::size_t cap, std::vector<std::byte>* out, std::uint64_t* runs);

// Checks that `body` holds exactly `runs` runs, each in range of a `segment_bytes`
// destination, increasing and not touching, with nothing after them.
Status check_runs(std::span<const std::byte> body, std::uint64_t runs, std::uint64_t segment_bytes,
                  std::string_view what);

// Writes the runs into `destination`. REQUIRES: check_runs() accepted `body`.
void apply_runs(std::span<const std::byte> body, std::uint64_t runs,
                std::span<std::byte> destination);

}  // namespace ferry::delta

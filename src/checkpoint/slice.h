// Box arithmetic for slices: intersections and strided copies between boxes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace ferry::checkpoint {

struct Box {
  std::vector<std::int64_t> offset, extent;
  std::int64_t volume() const;
  friend bool operator==(const Box&, const Box&) = default;
};

// Whether `inner` has `outer`'s number of dimensions, at least one element in each,
// and lies inside `outer`. `outer` must be valid (offsets and extents >= 0); `inner`
// may hold any values (a peer's request is checked with it).
bool contains(const Box& outer, const Box& inner);

// The common part of two boxes of one tensor (same number of dimensions); nullopt
// when empty.
std::optional<Box> intersect(const Box& a, const Box& b);

// Copies the part `region` (in global coordinates, inside both boxes) from
// `src`, holding box `src_box` row-major, to `dst`, holding `dst_box` row-major.
// Contiguous runs along the innermost dimensions are copied with one memcpy.
void copy_region(const Box& region, std::span<const std::byte> src, const Box& src_box,
                 std::span<std::byte> dst, const Box& dst_box, std::size_t element_bytes);

// When `region` (inside `box`) is one contiguous run of `box`'s row-major bytes,
// the element offset where it starts; nullopt otherwise.
std::optional<std::int64_t> contiguous_offset(const Box& region, const Box& box);

}  // namespace ferry::checkpoint

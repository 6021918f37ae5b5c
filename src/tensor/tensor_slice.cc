#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "ferry/tensor.h"

namespace ferry {
namespace {

// [first, end) of a run in the whole tensor and in the slice; false on overflow.
struct RunExtent {
  std::uint64_t whole_begin = 0, whole_end = 0, slice_begin = 0, slice_end = 0;
};

bool extent_of(const SliceRun& r, RunExtent* e) {
  std::uint64_t span = 0, bytes = 0, last = 0;
  if (r.count == 0 || r.block_bytes == 0) return false;
  if (__builtin_mul_overflow(r.count - 1, r.whole_stride, &last)) return false;
  if (__builtin_add_overflow(last, r.block_bytes, &span)) return false;
  if (__builtin_mul_overflow(r.count, r.block_bytes, &bytes)) return false;
  e->whole_begin = r.whole_offset;
  e->slice_begin = r.slice_offset;
  return !__builtin_add_overflow(r.whole_offset, span, &e->whole_end) &&
         !__builtin_add_overflow(r.slice_offset, bytes, &e->slice_end);
}

}  // namespace

Status TensorSlice::check() const {
  const std::string what = fmt::format("slice '{}' of {}", local.name, whole.to_string());
  if (local.dtype != whole.dtype) {
    return invalid_argument(fmt::format("{}: the slice is {}, the tensor {}", what,
                                        dtype_name(local.dtype), dtype_name(whole.dtype)));
  }
  std::uint64_t whole_done = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> slice_extents;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const SliceRun& r = runs[i];
    RunExtent e;
    if (!extent_of(r, &e)) {
      return invalid_argument(fmt::format("{}: run {} is empty or its extent overflows", what, i));
    }
    if (r.count > 1 && r.whole_stride < r.block_bytes) {
      return invalid_argument(fmt::format("{}: run {}'s blocks of {} bytes overlap (stride {})",
                                          what, i, r.block_bytes, r.whole_stride));
    }
    if (e.whole_end > whole.bytes() || e.slice_end > local.bytes()) {
      return invalid_argument(fmt::format(
          "{}: run {} reaches byte {} of the tensor ({} bytes) and {} of the slice ({} bytes)",
          what, i, e.whole_end, whole.bytes(), e.slice_end, local.bytes()));
    }
    if (e.whole_begin < whole_done) {
      return invalid_argument(
          fmt::format("{}: run {} starts at byte {} of the tensor, before the previous run's "
                      "end ({}): give runs in order, not overlapping",
                      what, i, e.whole_begin, whole_done));
    }
    whole_done = e.whole_end;
    slice_extents.emplace_back(e.slice_begin, e.slice_end);
  }
  std::sort(slice_extents.begin(), slice_extents.end());
  for (std::size_t i = 1; i < slice_extents.size(); ++i) {
    if (slice_extents[i].first < slice_extents[i - 1].second) {
      return invalid_argument(
          fmt::format("{}: two runs write slice byte {}", what, slice_extents[i].first));
    }
  }
  return ok_status();
}

std::uint64_t TensorSlice::selected_bytes() const {
  std::uint64_t n = 0;
  for (const SliceRun& r : runs) n += r.count * r.block_bytes;
  return n;
}

}  // namespace ferry

#include "checkpoint/slice.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

SliceSpec SliceSpec::whole(std::string name, DType dtype, std::vector<std::int64_t> shape) {
  std::vector<std::int64_t> offset(shape.size(), 0);
  std::vector<std::int64_t> extent = shape;
  return {std::move(name), dtype, std::move(shape), std::move(offset), std::move(extent)};
}

SliceSpec SliceSpec::along(std::string name, DType dtype, std::vector<std::int64_t> shape, int dim,
                           std::int64_t begin, std::int64_t count) {
  SliceSpec s = whole(std::move(name), dtype, std::move(shape));
  if (dim >= 0 && static_cast<std::size_t>(dim) < s.offset.size()) {
    s.offset[dim] = begin;
    s.extent[dim] = count;
  }
  return s;
}

Status SliceSpec::validate() const {
  const std::size_t nd = global_shape.size();
  if (offset.size() != nd || extent.size() != nd) {
    return invalid_argument("slice of tensor " + name + ": offset and extent need " +
                            std::to_string(nd) + " dimensions like its shape");
  }
  bool partial = false;
  for (std::size_t d = 0; d < nd; ++d) {
    if (global_shape[d] < 0 || offset[d] < 0 || extent[d] < 0 || offset[d] > global_shape[d] ||
        extent[d] > global_shape[d] - offset[d]) {
      return invalid_argument("slice " + to_string() + " is outside tensor " + name + " of shape " +
                              TensorSpec{name, dtype, global_shape}.shape_string());
    }
    partial = partial || extent[d] != global_shape[d];
  }
  if (auto n = element_count(global_shape, name); !n.ok()) return n.status();
  if (partial && dtype_bits(dtype) % 8 != 0) {
    return unimplemented("slice " + to_string() + ": partial slices of sub-byte dtype " +
                         std::string(dtype_name(dtype)) + " are not supported");
  }
  if (auto b = byte_size(dtype, Box{offset, extent}.volume(), name); !b.ok()) return b.status();
  return ok_status();
}

std::uint64_t SliceSpec::bytes() const {
  auto b = byte_size(dtype, static_cast<std::uint64_t>(Box{offset, extent}.volume()), name);
  return b.ok() ? *b : 0;
}

std::string SliceSpec::to_string() const {
  std::string s = name + "[";
  for (std::size_t d = 0; d < offset.size() && d < extent.size(); ++d) {
    if (d) s += ", ";
    s += std::to_string(offset[d]) + ":" + std::to_string(offset[d] + extent[d]);
  }
  return s + "]";
}

std::int64_t Box::volume() const {
  std::int64_t v = 1;
  for (std::int64_t e : extent) v *= e;
  return v;
}

bool contains(const Box& outer, const Box& inner) {
  const std::size_t nd = outer.offset.size();
  if (outer.extent.size() != nd || inner.offset.size() != nd || inner.extent.size() != nd) {
    return false;
  }
  for (std::size_t d = 0; d < nd; ++d) {
    // Subtractions only of values known to be in range: no overflow.
    if (inner.offset[d] < outer.offset[d] || inner.extent[d] < 1) return false;
    if (inner.offset[d] - outer.offset[d] > outer.extent[d] - inner.extent[d]) return false;
  }
  return true;
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box out;
  for (std::size_t d = 0; d < a.offset.size(); ++d) {
    const std::int64_t lo = std::max(a.offset[d], b.offset[d]);
    const std::int64_t hi = std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    if (hi <= lo) return std::nullopt;
    out.offset.push_back(lo);
    out.extent.push_back(hi - lo);
  }
  return out;
}

std::optional<std::int64_t> contiguous_offset(const Box& region, const Box& box) {
  const int nd = static_cast<int>(region.offset.size());
  int k = 0;
  while (k < nd - 1 && region.extent[k] == 1) ++k;  // leading single rows
  for (int d = k + 1; d < nd; ++d) {
    if (region.extent[d] != box.extent[d]) return std::nullopt;
  }
  std::int64_t offset = 0, stride = 1;
  for (int d = nd - 1; d >= 0; --d) {
    offset += (region.offset[d] - box.offset[d]) * stride;
    stride *= box.extent[d];
  }
  return offset;
}

void copy_region(const Box& region, std::span<const std::byte> src, const Box& src_box,
                 std::span<std::byte> dst, const Box& dst_box, std::size_t element_bytes) {
  const int nd = static_cast<int>(region.offset.size());
  // Innermost dimensions the region spans whole in both boxes merge into one run.
  int k = nd - 1;
  std::int64_t run = 1;
  while (k >= 0 && region.extent[k] == src_box.extent[k] && region.extent[k] == dst_box.extent[k]) {
    run *= region.extent[k];
    --k;
  }
  if (k >= 0) run *= region.extent[k];  // dimension k is copied partially, in runs
  std::vector<std::int64_t> src_stride(nd, 1), dst_stride(nd, 1);
  for (int d = nd - 2; d >= 0; --d) {
    src_stride[d] = src_stride[d + 1] * src_box.extent[d + 1];
    dst_stride[d] = dst_stride[d + 1] * dst_box.extent[d + 1];
  }
  std::int64_t src_base = 0, dst_base = 0;
  for (int d = 0; d < nd; ++d) {
    src_base += (region.offset[d] - src_box.offset[d]) * src_stride[d];
    dst_base += (region.offset[d] - dst_box.offset[d]) * dst_stride[d];
  }
  const std::size_t run_bytes = static_cast<std::size_t>(run) * element_bytes;
  std::vector<std::int64_t> idx(std::max(k, 0), 0);  // odometer over dims [0, k)
  while (true) {
    std::int64_t so = src_base, dof = dst_base;
    for (int d = 0; d < k; ++d) {
      so += idx[d] * src_stride[d];
      dof += idx[d] * dst_stride[d];
    }
    std::memcpy(dst.data() + static_cast<std::size_t>(dof) * element_bytes,
                src.data() + static_cast<std::size_t>(so) * element_bytes, run_bytes);
    int d = k - 1;
    while (d >= 0 && ++idx[d] == region.extent[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

}  // namespace ferry::checkpoint

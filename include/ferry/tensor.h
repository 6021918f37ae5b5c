// Tensors as ferry sees them: a dtype, a shape and bytes.
//
// DType covers every dtype of the safetensors format. TensorSpec describes a
// tensor (no memory); TensorView is a spec plus memory it does not own, in the
// spirit of leveldb's Slice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"

namespace ferry {

// The order is safetensors' (by alignment, then name); values are stable and
// travel on the wire, so new dtypes are only ever appended.
enum class DType : std::uint8_t {
  kBool = 0,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kF64,
  kU64,
  kI64,
  kF8_E4M3,
  kF8_E5M2,
  kF8_E8M0,  // MX scale factors
  kF4,       // E2M1, two per byte
  kF6_E2M3,  // four per three bytes
  kF6_E3M2,
  kC64,  // complex64: two F32
};
inline constexpr int kDTypeCount = 20;

// Bits per element (1 byte = 8; F4 = 4; F6_* = 6).
FERRY_EXPORT int dtype_bits(DType dtype);
// The safetensors name: "BF16", "F8_E4M3", ...
FERRY_EXPORT std::string_view dtype_name(DType dtype);
// The torch name: "torch.bfloat16", ... ("" where torch has none).
FERRY_EXPORT std::string_view dtype_torch_name(DType dtype);
// Bytes one element needs for alignment purposes (1 for sub-byte dtypes).
FERRY_EXPORT int dtype_alignment(DType dtype);

// Accepts safetensors names ("F32"), torch names ("torch.float32", "float32"),
// and common short forms ("fp32", "bf16", "half", "float", "int8", ...),
// case-insensitively. The error lists the accepted names.
FERRY_EXPORT Result<DType> parse_dtype(std::string_view text);

// Elements in a shape; an overflow of uint64 is an error naming `what`.
FERRY_EXPORT Result<std::uint64_t> element_count(std::span<const std::int64_t> shape,
                                                 std::string_view what);
// Bytes for `elements` of `dtype`; sub-byte dtypes must fill whole bytes.
FERRY_EXPORT Result<std::uint64_t> byte_size(DType dtype, std::uint64_t elements,
                                             std::string_view what);

struct FERRY_EXPORT TensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<std::int64_t> shape;

  // Builds a spec after checking shape (no negative dims) and size overflow.
  static Result<TensorSpec> make(std::string name, DType dtype, std::vector<std::int64_t> shape);

  // REQUIRES: the spec was validated (made by make() or read by a ferry reader).
  std::uint64_t elements() const;
  std::uint64_t bytes() const;

  // "name [151936, 4096] F32"
  std::string to_string() const;
  // "[151936, 4096]"
  std::string shape_string() const;

  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

// A tensor's spec and bytes the view does not own. REQUIRES: data.size() == spec.bytes().
struct TensorView {
  TensorSpec spec;
  std::span<const std::byte> data;
};

// A writable view, for destinations a receiver fills.
struct MutableTensorView {
  TensorSpec spec;
  std::span<std::byte> data;
};

// Bytes of a whole tensor that make up part of it (one tensor-parallel rank's slice): `count`
// blocks of `block_bytes`; block i is the whole tensor's bytes
// [whole_offset + i * whole_stride, + block_bytes) and the slice's
// [slice_offset + i * block_bytes, + block_bytes). A dim-0 slice is one block; a dim-1 slice of
// a matrix is one block per row, strided by the row's bytes.
struct SliceRun {
  std::uint64_t slice_offset = 0;
  std::uint64_t whole_offset = 0;
  std::uint64_t block_bytes = 0;
  std::uint64_t count = 1;
  std::uint64_t whole_stride = 0;
};

// One rank's slice of a tensor: `local` (its name, dtype, local shape) holds the bytes of
// `whole` (the tensor a sender sends) that `runs` select. Local bytes no run covers (vocabulary
// padding rows) are never written by a receiver: they keep what the memory holds.
struct FERRY_EXPORT TensorSlice {
  TensorSpec whole;
  TensorSpec local;
  std::vector<SliceRun> runs;  // in order of whole_offset, each after the previous one's end

  // OK when both specs match in dtype, every run lies inside both tensors, runs are in
  // order and do not overlap (in either tensor); the error names the tensor and the run.
  Status check() const;
  // Bytes the runs select: what a receiver copies of this tensor each round.
  std::uint64_t selected_bytes() const;
};

}  // namespace ferry

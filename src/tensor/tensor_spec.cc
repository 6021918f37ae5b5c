#include <string>

#include "ferry/tensor.h"

namespace ferry {

Result<std::uint64_t> element_count(std::span<const std::int64_t> shape, std::string_view what) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) {
      return invalid_argument(std::string(what) + ": negative dimension " + std::to_string(d));
    }
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) {
      return invalid_argument(std::string(what) + ": element count overflows 64 bits");
    }
  }
  return n;
}

Result<std::uint64_t> byte_size(DType dtype, std::uint64_t elements, std::string_view what) {
  std::uint64_t bits = 0;
  if (__builtin_mul_overflow(elements, static_cast<std::uint64_t>(dtype_bits(dtype)), &bits)) {
    return invalid_argument(std::string(what) + ": byte size overflows 64 bits");
  }
  if (bits % 8 != 0) {
    return invalid_argument(std::string(what) + ": " + std::to_string(elements) + " elements of " +
                            std::string(dtype_name(dtype)) + " do not fill whole bytes");
  }
  return bits / 8;
}

Result<TensorSpec> TensorSpec::make(std::string name, DType dtype,
                                    std::vector<std::int64_t> shape) {
  if (static_cast<int>(dtype) >= kDTypeCount) {
    return invalid_argument("tensor '" + name + "': dtype value " +
                            std::to_string(static_cast<int>(dtype)) + " is not a dtype");
  }
  auto n = element_count(shape, "tensor '" + name + "'");
  if (!n.ok()) return n.status();
  auto b = byte_size(dtype, *n, "tensor '" + name + "'");
  if (!b.ok()) return b.status();
  return TensorSpec{std::move(name), dtype, std::move(shape)};
}

std::uint64_t TensorSpec::elements() const {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::uint64_t TensorSpec::bytes() const {
  return elements() * static_cast<std::uint64_t>(dtype_bits(dtype)) / 8;
}

std::string TensorSpec::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string TensorSpec::to_string() const {
  return name + " " + shape_string() + " " + std::string(dtype_name(dtype));
}

}  // namespace ferry

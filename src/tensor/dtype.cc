#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "ferry/tensor.h"

namespace ferry {
namespace {

struct DTypeInfo {
  DType dtype;
  int bits;
  std::string_view name;
  std::string_view torch_name;
};

constexpr std::array<DTypeInfo, kDTypeCount> kInfo = {{
    {DType::kBool, 8, "BOOL", "torch.bool"},
    {DType::kU8, 8, "U8", "torch.uint8"},
    {DType::kI8, 8, "I8", "torch.int8"},
    {DType::kU16, 16, "U16", "torch.uint16"},
    {DType::kI16, 16, "I16", "torch.int16"},
    {DType::kF16, 16, "F16", "torch.float16"},
    {DType::kBF16, 16, "BF16", "torch.bfloat16"},
    {DType::kU32, 32, "U32", "torch.uint32"},
    {DType::kI32, 32, "I32", "torch.int32"},
    {DType::kF32, 32, "F32", "torch.float32"},
    {DType::kF64, 64, "F64", "torch.float64"},
    {DType::kU64, 64, "U64", "torch.uint64"},
    {DType::kI64, 64, "I64", "torch.int64"},
    {DType::kF8_E4M3, 8, "F8_E4M3", "torch.float8_e4m3fn"},
    {DType::kF8_E5M2, 8, "F8_E5M2", "torch.float8_e5m2"},
    {DType::kF8_E8M0, 8, "F8_E8M0", "torch.float8_e8m0fnu"},
    {DType::kF4, 4, "F4", "torch.float4_e2m1fn_x2"},
    {DType::kF6_E2M3, 6, "F6_E2M3", ""},
    {DType::kF6_E3M2, 6, "F6_E3M2", ""},
    {DType::kC64, 64, "C64", "torch.complex64"},
}};

const DTypeInfo& info(DType dtype) { return kInfo[static_cast<std::size_t>(dtype)]; }

struct Alias {
  std::string_view alias;
  DType dtype;
};

// Lower-case spellings users write beyond the safetensors and torch names.
constexpr Alias kAliases[] = {
    {"bool", DType::kBool},
    {"uint8", DType::kU8},
    {"int8", DType::kI8},
    {"uint16", DType::kU16},
    {"int16", DType::kI16},
    {"short", DType::kI16},
    {"float16", DType::kF16},
    {"fp16", DType::kF16},
    {"half", DType::kF16},
    {"bfloat16", DType::kBF16},
    {"bf16", DType::kBF16},
    {"uint32", DType::kU32},
    {"int32", DType::kI32},
    {"int", DType::kI32},
    {"float32", DType::kF32},
    {"fp32", DType::kF32},
    {"float", DType::kF32},
    {"float64", DType::kF64},
    {"fp64", DType::kF64},
    {"double", DType::kF64},
    {"uint64", DType::kU64},
    {"int64", DType::kI64},
    {"long", DType::kI64},
    {"float8_e4m3fn", DType::kF8_E4M3},
    {"fp8_e4m3", DType::kF8_E4M3},
    {"float8_e5m2", DType::kF8_E5M2},
    {"fp8_e5m2", DType::kF8_E5M2},
    {"float8_e8m0fnu", DType::kF8_E8M0},
    {"float4_e2m1fn_x2", DType::kF4},
    {"fp4", DType::kF4},
    {"complex64", DType::kC64},
    {"cfloat", DType::kC64},
};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

int dtype_bits(DType dtype) { return info(dtype).bits; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }
std::string_view dtype_torch_name(DType dtype) { return info(dtype).torch_name; }
int dtype_alignment(DType dtype) { return std::max(1, info(dtype).bits / 8); }

Result<DType> parse_dtype(std::string_view text) {
  std::string key = lower(text);
  if (key.starts_with("torch.")) key.erase(0, 6);
  for (const DTypeInfo& d : kInfo) {
    if (key == lower(d.name)) return d.dtype;
  }
  for (const Alias& a : kAliases) {
    if (key == a.alias) return a.dtype;
  }
  std::string names;
  for (const DTypeInfo& d : kInfo) {
    names += names.empty() ? "" : ", ";
    names += d.name;
  }
  return invalid_argument("unknown dtype '" + std::string(text) + "'; expected one of " + names +
                          " or a torch name such as torch.bfloat16, bf16, fp16, float32");
}

}  // namespace ferry

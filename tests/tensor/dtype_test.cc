#include <gtest/gtest.h>

#include "ferry/tensor.h"
#include "support/status_matchers.h"

namespace ferry {
namespace {

TEST(DType, EverySafetensorsNameRoundTrips) {
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto d = static_cast<DType>(i);
    auto parsed = parse_dtype(dtype_name(d));
    ASSERT_OK(parsed) << dtype_name(d);
    EXPECT_EQ(*parsed, d);
  }
}

TEST(DType, ElementSizesMatchTheFormat) {
  EXPECT_EQ(dtype_bits(DType::kBool), 8);
  EXPECT_EQ(dtype_bits(DType::kBF16), 16);
  EXPECT_EQ(dtype_bits(DType::kF32), 32);
  EXPECT_EQ(dtype_bits(DType::kI64), 64);
  EXPECT_EQ(dtype_bits(DType::kF8_E4M3), 8);
  EXPECT_EQ(dtype_bits(DType::kF4), 4);
  EXPECT_EQ(dtype_bits(DType::kF6_E3M2), 6);
  EXPECT_EQ(dtype_bits(DType::kC64), 64);
}

TEST(DType, AcceptsTorchAndShortSpellings) {
  EXPECT_EQ(*parse_dtype("torch.float32"), DType::kF32);
  EXPECT_EQ(*parse_dtype("float32"), DType::kF32);
  EXPECT_EQ(*parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(*parse_dtype("fp16"), DType::kF16);
  EXPECT_EQ(*parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(*parse_dtype("torch.int8"), DType::kI8);
  EXPECT_EQ(*parse_dtype("torch.float8_e4m3fn"), DType::kF8_E4M3);
}

TEST(DType, UnknownNameListsAcceptedOnes) {
  auto r = parse_dtype("float13");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("float13"), std::string::npos);
  EXPECT_NE(r.status().message().find("BF16"), std::string::npos);
}

TEST(TensorSpec, ComputesBytes) {
  auto s = TensorSpec::make("model.embed_tokens.weight", DType::kF32, {151936, 4096});
  ASSERT_OK(s);
  EXPECT_EQ(s->bytes(), 2'489'319'424ULL);
  EXPECT_EQ(s->to_string(), "model.embed_tokens.weight [151936, 4096] F32");
  auto scalar = TensorSpec::make("step", DType::kI64, {});
  ASSERT_OK(scalar);
  EXPECT_EQ(scalar->bytes(), 8u);
}

TEST(TensorSpec, RejectsOverflowNegativeAndPartialBytes) {
  EXPECT_FALSE(TensorSpec::make("t", DType::kF32, {-1, 4}).ok());
  auto big = TensorSpec::make("huge", DType::kF64, {1LL << 40, 1LL << 40});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("huge"), std::string::npos);
  // Three 4-bit values do not fill whole bytes.
  EXPECT_FALSE(TensorSpec::make("f4", DType::kF4, {3}).ok());
  auto f4 = TensorSpec::make("f4", DType::kF4, {4});
  ASSERT_OK(f4);
  EXPECT_EQ(f4->bytes(), 2u);
}

}  // namespace
}  // namespace ferry

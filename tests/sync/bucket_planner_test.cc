#include "sync/bucket_planner.h"

#include <gtest/gtest.h>

#include <map>

#include "support/status_matchers.h"

namespace ferry::sync {
namespace {

TensorSpec spec(const std::string& name, DType dtype, std::vector<std::int64_t> shape) {
  auto s = TensorSpec::make(name, dtype, std::move(shape));
  EXPECT_OK(s);
  return *s;
}

// Every invariant a plan must hold, checked piece by piece.
void check_plan(const std::vector<TensorSpec>& manifest, const BucketPlan& plan) {
  std::vector<std::uint64_t> covered(manifest.size(), 0);
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> ends;  // overlap check
  std::uint64_t total = 0;
  for (const auto& t : manifest) total += t.bytes();
  EXPECT_EQ(plan.total_bytes, total);
  ASSERT_EQ(plan.bucket_begin.size(), plan.bucket_used.size() + 1);
  for (std::uint32_t b = 0; b < plan.bucket_count(); ++b) {
    std::uint64_t last_end = 0;
    for (const Piece& p : plan.bucket(b)) {
      ASSERT_EQ(p.bucket, b);
      const TensorSpec& t = manifest[p.tensor];
      const std::uint64_t unit = split_unit(t.dtype);
      EXPECT_EQ(p.bucket_offset % kPieceAlignment, 0u) << t.name;
      EXPECT_EQ(p.bucket_offset % static_cast<std::uint64_t>(dtype_alignment(t.dtype)), 0u);
      EXPECT_EQ(p.tensor_offset % unit, 0u) << t.name << ": piece splits an element";
      EXPECT_EQ(p.tensor_offset, covered[p.tensor]) << t.name << ": pieces out of order";
      EXPECT_GE(p.bucket_offset, last_end) << "pieces overlap in bucket " << b;
      EXPECT_LE(p.bucket_offset + p.length, plan.bucket_bytes);
      EXPECT_TRUE(p.length > 0 || t.bytes() == 0);
      covered[p.tensor] += p.length;
      last_end = p.bucket_offset + p.length;
    }
    EXPECT_EQ(plan.bucket_used[b], last_end);
    EXPECT_GT(plan.bucket(b).size(), 0u) << "empty bucket " << b;
  }
  for (std::size_t t = 0; t < manifest.size(); ++t) {
    EXPECT_EQ(covered[t], manifest[t].bytes()) << manifest[t].name;
    const Piece& first = plan.pieces[plan.first_piece[t]];
    EXPECT_EQ(first.tensor, t);
    EXPECT_EQ(first.tensor_offset, 0u);
    for (std::uint32_t i = 0; i < plan.piece_count[t]; ++i) {
      EXPECT_EQ(plan.pieces[plan.first_piece[t] + i].tensor, t);
    }
  }
}

TEST(BucketPlanner, SmallTensorsShareABucketAligned) {
  std::vector<TensorSpec> m = {spec("a", DType::kU8, {3}), spec("b", DType::kF32, {5}),
                               spec("c", DType::kBF16, {1})};
  auto plan = plan_buckets(m, 64);
  ASSERT_OK(plan);
  ASSERT_EQ(plan->bucket_count(), 1u);
  ASSERT_EQ(plan->pieces.size(), 3u);
  EXPECT_EQ(plan->pieces[0], (Piece{0, 0, 0, 0, 3}));
  EXPECT_EQ(plan->pieces[1], (Piece{1, 0, 0, 16, 20}));
  EXPECT_EQ(plan->pieces[2], (Piece{2, 0, 0, 48, 2}));
  EXPECT_EQ(plan->bucket_used[0], 50u);
  check_plan(m, *plan);
}

TEST(BucketPlanner, ATensorLargerThanTheBucketSpansMany) {
  // The FAQ's case in miniature: an embedding of 1000 F32 values through 64-byte buckets.
  std::vector<TensorSpec> m = {spec("embed", DType::kF32, {10, 100}),
                               spec("norm", DType::kF32, {4})};
  auto plan = plan_buckets(m, 64);
  ASSERT_OK(plan);
  EXPECT_EQ(plan->piece_count[0], 63u);  // 4000 bytes: 62 full buckets and 32 bytes
  EXPECT_EQ(plan->bucket_count(), 63u);  // norm fits after the last 32 bytes
  check_plan(m, *plan);
}

TEST(BucketPlanner, EveryBucketSizeAndDtypeMix) {
  std::vector<TensorSpec> m = {
      spec("f64", DType::kF64, {7}),   spec("u8", DType::kU8, {13}),
      spec("f4", DType::kF4, {22}),    spec("f6", DType::kF6_E2M3, {4, 5}),
      spec("empty", DType::kF32, {0}), spec("bf16", DType::kBF16, {33, 3}),
      spec("c64", DType::kC64, {9}),   spec("bool", DType::kBool, {5}),
      spec("scalar", DType::kF32, {}), spec("f8", DType::kF8_E4M3, {100}),
  };
  for (std::uint64_t bucket = 16; bucket <= 1024; bucket += 16) {
    auto plan = plan_buckets(m, bucket);
    ASSERT_OK(plan) << bucket;
    check_plan(m, *plan);
    // Deterministic: the same input gives the same plan.
    auto again = plan_buckets(m, bucket);
    EXPECT_EQ(plan->pieces, again->pieces);
  }
}

TEST(BucketPlanner, SubByteDtypesSplitOnWholeElements) {
  EXPECT_EQ(split_unit(DType::kF4), 1u);
  EXPECT_EQ(split_unit(DType::kF6_E3M2), 3u);
  EXPECT_EQ(split_unit(DType::kBF16), 2u);
  EXPECT_EQ(split_unit(DType::kC64), 8u);
  // 40 F6 values = 30 bytes through 16-byte buckets: pieces of 15 bytes (5 groups of 4).
  std::vector<TensorSpec> m = {spec("f6", DType::kF6_E2M3, {40})};
  auto plan = plan_buckets(m, 16);
  ASSERT_OK(plan);
  ASSERT_EQ(plan->pieces.size(), 2u);
  EXPECT_EQ(plan->pieces[0].length, 15u);
  EXPECT_EQ(plan->pieces[1].tensor_offset, 15u);
  check_plan(m, *plan);
}

TEST(BucketPlanner, EmptyManifestsAndBadBucketSizes) {
  auto plan = plan_buckets({}, 64);
  ASSERT_OK(plan);
  EXPECT_EQ(plan->bucket_count(), 0u);
  EXPECT_EQ(plan_buckets({}, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(plan_buckets({}, 24).status().code(), Code::kInvalidArgument);
  // Only empty tensors: one bucket holding zero-length pieces.
  std::vector<TensorSpec> m = {spec("e1", DType::kF32, {0}), spec("e2", DType::kU8, {0, 5})};
  plan = plan_buckets(m, 64);
  ASSERT_OK(plan);
  EXPECT_EQ(plan->bucket_count(), 1u);
  check_plan(m, *plan);
}

// A peer's BEGIN names the manifest and bucket: a 1 EiB tensor through tiny buckets is refused
// at once, before the planner loops over (and allocates ~128 GiB for) billions of pieces.
TEST(BucketPlanner, APlanTooLargeToHoldIsRefusedBeforeItIsBuilt) {
  const std::vector<TensorSpec> huge = {spec("huge", DType::kU8, {std::int64_t{1} << 60})};
  auto plan = plan_buckets(huge, kPieceAlignment);
  EXPECT_EQ(plan.status().code(), Code::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("use a larger bucket"), std::string::npos);
  // A large plan within the limit is planned as usual.
  const std::vector<TensorSpec> fits = {spec("fits", DType::kU8, {std::int64_t{1} << 20})};
  EXPECT_OK(plan_buckets(fits, kPieceAlignment));
}

TEST(BucketPlanner, QwenEmbeddingThrough512MiBBucket) {
  // [151936, 4096] F32 is 2.49 GB: five buckets of 512 MiB, without allocating any.
  std::vector<TensorSpec> m = {spec("model.embed_tokens.weight", DType::kF32, {151936, 4096}),
                               spec("model.norm.weight", DType::kF32, {4096})};
  auto plan = plan_buckets(m, 512ull << 20);
  ASSERT_OK(plan);
  EXPECT_EQ(plan->piece_count[0], 5u);
  EXPECT_EQ(plan->bucket_count(), 5u);
  check_plan(m, *plan);
}

}  // namespace
}  // namespace ferry::sync

// The format's names and checks: step folders, node names, paths read from a
// manifest, and the strided copy between boxes.
#include "checkpoint/format.h"

#include <gtest/gtest.h>

#include <limits>
#include <numeric>

#include "checkpoint/slice.h"
#include "support/status_matchers.h"

namespace ferry::checkpoint {
namespace {

TEST(Format, StepFoldersHaveOneNamePerStep) {
  EXPECT_EQ(format::step_folder(12), "step_12");
  EXPECT_EQ(format::parse_ferry_step_folder("step_12"), 12);
  EXPECT_FALSE(format::parse_ferry_step_folder("step_012").has_value());
  EXPECT_FALSE(format::parse_ferry_step_folder("step_").has_value());
  EXPECT_FALSE(format::parse_ferry_step_folder("step_1x").has_value());
  EXPECT_FALSE(format::parse_ferry_step_folder("global_step_1").has_value());
  EXPECT_EQ(format::parse_node_marker("NODE_n0.committed"), "n0");
  EXPECT_FALSE(format::parse_node_marker("NODE_.committed").has_value());
}

TEST(Format, PathsFromAManifestMustStayInsideTheCheckpoint) {
  EXPECT_OK(validate_relative_path("rank_00000.safetensors", "file"));
  EXPECT_OK(validate_relative_path("sub/rank_00000.safetensors", "file"));
  for (const char* bad : {"../step_1/rank_00000.safetensors", "/etc/passwd", "a/../../b", "a//b",
                          "./a", "a/..", "", "a\\..\\b"}) {
    Status s = validate_relative_path(bad, "file");
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("inside the checkpoint folder"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(validate_relative_path(std::string_view("a\0b", 3), "file").ok());
  EXPECT_OK(format::validate_node_name("node-1.rack_2"));
  for (const char* bad : {"..", ".", "a/b", "", "a b"}) {
    EXPECT_FALSE(format::validate_node_name(bad).ok()) << bad;
  }
}

Manifest small_manifest() {
  Manifest m;
  m.step = 3;
  m.layout = {1, 1, {"n0"}, {"n0"}};
  m.common_state = R"({"epoch":2})";
  m.files = {{"rank_00000.safetensors", 0, "n0", 200}};
  SavedTensor t{"w", DType::kF32, {4, 2}, {}};
  t.slices.push_back({0, "rank_00000.safetensors", "w", {0, 0}, {4, 2}, 96, 32, 0x1234});
  m.tensors.push_back(t);
  return m;
}

TEST(Format, ManifestRoundTripsAndRefusesEscapingPaths) {
  Manifest m = small_manifest();
  const std::string text = format::encode_manifest(m);
  auto back = format::decode_manifest(text, "manifest.json");
  ASSERT_OK(back);
  EXPECT_EQ(back->tensors[0].slices[0].xxh3, 0x1234u);
  EXPECT_EQ(back->common_state, R"({"epoch":2})");
  EXPECT_EQ(format::encode_manifest(*back), text);

  for (const std::string evil : {"../../etc/passwd", "/etc/passwd", "x/../../y"}) {
    Manifest e = small_manifest();
    e.files[0].file = evil;
    e.tensors[0].slices[0].file = evil;
    auto r = format::decode_manifest(format::encode_manifest(e), "manifest.json");
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << evil;
    EXPECT_NE(r.status().message().find(evil), std::string::npos) << r.status().message();
  }
  Manifest out_of_bounds = small_manifest();
  out_of_bounds.tensors[0].slices[0].offset = {2, 0};  // rows 2..6 of a 4-row tensor
  auto r = format::decode_manifest(format::encode_manifest(out_of_bounds), "manifest.json");
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  Manifest past_end = small_manifest();
  past_end.tensors[0].slices[0].data_offset = 190;
  EXPECT_FALSE(format::decode_manifest(format::encode_manifest(past_end), "m").ok());
  EXPECT_FALSE(
      format::decode_manifest("{\"format\":\"ferry-checkpoint\",\"version\":99}", "m").ok());
}

// copy_region against an element-by-element reference, over 3-D boxes.
TEST(Slice, CopyRegionMatchesElementwiseCopy) {
  const std::vector<std::int64_t> shape = {5, 6, 7};
  std::vector<std::uint16_t> global(5 * 6 * 7);
  std::iota(global.begin(), global.end(), 1);
  auto at = [&](std::int64_t i, std::int64_t j, std::int64_t k) {
    return global[(i * 6 + j) * 7 + k];
  };
  const Box src{{1, 0, 2}, {4, 6, 5}};
  std::vector<std::uint16_t> src_data;
  for (std::int64_t i = 1; i < 5; ++i)
    for (std::int64_t j = 0; j < 6; ++j)
      for (std::int64_t k = 2; k < 7; ++k) src_data.push_back(at(i, j, k));
  const Box dst{{0, 1, 0}, {3, 4, 7}};
  auto region = intersect(src, dst);
  ASSERT_TRUE(region.has_value());
  EXPECT_EQ(*region, (Box{{1, 1, 2}, {2, 4, 5}}));
  std::vector<std::uint16_t> dst_data(3 * 4 * 7, 0);
  copy_region(*region, std::as_bytes(std::span(src_data)), src,
              std::as_writable_bytes(std::span(dst_data)), dst, 2);
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 4; ++j)
      for (std::int64_t k = 0; k < 7; ++k) {
        const bool inside = i >= 1 && k >= 2;
        EXPECT_EQ(dst_data[(i * 4 + j) * 7 + k], inside ? at(i, j + 1, k) : 0) << i << j << k;
      }
  EXPECT_FALSE(intersect(Box{{0}, {3}}, Box{{3}, {2}}).has_value());
}

TEST(Slice, ContainsRefusesWrongRankEmptyNegativeAndOverflowingBoxes) {
  const Box outer{{4, 0}, {4, 8}};
  EXPECT_TRUE(contains(outer, Box{{4, 0}, {4, 8}}));
  EXPECT_TRUE(contains(outer, Box{{7, 7}, {1, 1}}));
  EXPECT_FALSE(contains(outer, Box{{4}, {4}}));              // fewer dimensions
  EXPECT_FALSE(contains(outer, Box{{4, 0, 0}, {1, 1, 1}}));  // more dimensions
  EXPECT_FALSE(contains(outer, Box{{4, 0}, {1}}));           // offset and extent disagree
  EXPECT_FALSE(contains(outer, Box{{4, 0}, {0, 8}}));        // empty
  EXPECT_FALSE(contains(outer, Box{{3, 0}, {1, 8}}));        // starts before
  EXPECT_FALSE(contains(outer, Box{{7, 0}, {2, 8}}));        // ends after
  EXPECT_FALSE(contains(outer, Box{{4, -1}, {1, 1}}));
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  const std::int64_t small = std::numeric_limits<std::int64_t>::min();
  EXPECT_FALSE(contains(outer, Box{{big, 0}, {big, 1}}));
  EXPECT_FALSE(contains(outer, Box{{5, 0}, {big, 1}}));
  EXPECT_FALSE(contains(outer, Box{{small, 0}, {1, 1}}));
  EXPECT_FALSE(contains(outer, Box{{5, 0}, {small, 1}}));
}

TEST(Slice, ContiguousOffsetOnlyForOneRun) {
  const Box box{{0, 0, 0}, {4, 6, 7}};
  EXPECT_EQ(contiguous_offset(Box{{1, 0, 0}, {2, 6, 7}}, box), 42);           // whole rows
  EXPECT_EQ(contiguous_offset(Box{{2, 3, 0}, {1, 2, 7}}, box), 2 * 42 + 21);  // within one row
  EXPECT_EQ(contiguous_offset(Box{{2, 3, 4}, {1, 1, 2}}, box), 2 * 42 + 21 + 4);
  EXPECT_FALSE(contiguous_offset(Box{{0, 0, 0}, {2, 3, 7}}, box).has_value());
  EXPECT_FALSE(contiguous_offset(Box{{0, 0, 1}, {1, 2, 3}}, box).has_value());
}

TEST(Slice, SpecsAreCheckedAgainstTheirTensor) {
  EXPECT_OK(SliceSpec::along("w", DType::kBF16, {8, 4}, 0, 4, 4).validate());
  EXPECT_EQ(SliceSpec::along("w", DType::kBF16, {8, 4}, 0, 6, 4).validate().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(SliceSpec::along("w", DType::kF4, {8, 4}, 0, 0, 4).validate().code(),
            Code::kUnimplemented);
  EXPECT_OK(SliceSpec::whole("w", DType::kF4, {8, 4}).validate());
  EXPECT_EQ(SliceSpec::along("w", DType::kBF16, {8, 4}, 1, 1, 2).to_string(), "w[0:8, 1:3]");
}

}  // namespace
}  // namespace ferry::checkpoint

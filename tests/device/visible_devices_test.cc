// Visible-device masks, parsed by each runtime's documented rules (docs/doctor.md).
#include <gtest/gtest.h>

#include "ferry/device.h"

namespace ferry::device {
namespace {

DeviceInventory eight() { return DeviceInventory{8, {}, {}, {}}; }

DeviceInventory four_gpus() {
  DeviceInventory inv;
  inv.count = 4;
  inv.uuids = {
      "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-1a2b3c4d-0000-1111-2222-333344445555",
      "GPU-1a2b9999-0000-1111-2222-333344445555", "GPU-77777777-0000-1111-2222-333344445555"};
  inv.mig_uuids = {"MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"};
  inv.mig_parent = {3};
  return inv;
}

TEST(AscendMask, UnsetShowsEveryDevice) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kAscend, std::nullopt, eight());
  EXPECT_FALSE(m.set);
  EXPECT_EQ(m.physical, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(AscendMask, LogicalToPhysical) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kAscend, "4,5,6,7", eight());
  EXPECT_EQ(m.physical, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_TRUE(m.ignored.empty());
  EXPECT_TRUE(m.violation.empty());
}

TEST(AscendMask, StopsAtTheFirstOtherCharacter) {
  // CANN's own example: "1, 2,3" reads as 1 only (the space stops it).
  const VisibleDevices m = parse_visible_devices(MaskKind::kAscend, "1, 2,3", eight());
  EXPECT_EQ(m.physical, (std::vector<int>{1}));
  EXPECT_EQ(m.ignored, " 2,3");
}

TEST(AscendMask, StopsAtTheFirstInvalidId) {
  // CANN's own example: "1,3,8" on an 8-device node reads as 1 and 3.
  const VisibleDevices m = parse_visible_devices(MaskKind::kAscend, "1,3,8", eight());
  EXPECT_EQ(m.physical, (std::vector<int>{1, 3}));
  EXPECT_EQ(m.ignored, "8");
  EXPECT_NE(m.ignored_reason.find("does not exist"), std::string::npos);
}

TEST(AscendMask, RangesAreNotAccepted) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kAscend, "0-3", eight());
  EXPECT_TRUE(m.hides_all());
  EXPECT_EQ(m.ignored, "0-3");
}

TEST(AscendMask, DescendingAndRepeatedIdsViolateTheRule) {
  EXPECT_NE(parse_visible_devices(MaskKind::kAscend, "1,0", eight()).violation.find("ascending"),
            std::string::npos);
  EXPECT_NE(parse_visible_devices(MaskKind::kAscend, "2,2", eight()).violation.find("twice"),
            std::string::npos);
}

TEST(AscendMask, EmptyHidesAll) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kAscend, "", eight());
  EXPECT_TRUE(m.set);
  EXPECT_TRUE(m.hides_all());
}

TEST(AscendMask, UnknownCountSkipsTheRangeCheck) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kAscend, "12,13", DeviceInventory{});
  EXPECT_EQ(m.physical, (std::vector<int>{12, 13}));
}

TEST(CudaMask, OrderIsKept) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kCuda, "2,1", four_gpus());
  EXPECT_EQ(m.physical, (std::vector<int>{2, 1}));
}

TEST(CudaMask, StopsAtTheFirstInvalidIndex) {
  // CUDA's own example: 0,2,-1,1 makes 0 and 2 visible.
  const VisibleDevices m = parse_visible_devices(MaskKind::kCuda, "0,2,-1,1", four_gpus());
  EXPECT_EQ(m.physical, (std::vector<int>{0, 2}));
  EXPECT_EQ(m.ignored, "-1,1");
}

TEST(CudaMask, OutOfRangeStops) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kCuda, "3,4,0", four_gpus());
  EXPECT_EQ(m.physical, (std::vector<int>{3}));
}

TEST(CudaMask, LeadingDigitsAreRead) {
  // The driver reads an entry strtoul-style ("1gpu2" is 1), as PyTorch models it.
  const VisibleDevices m = parse_visible_devices(MaskKind::kCuda, "1gpu2, 2", four_gpus());
  EXPECT_EQ(m.physical, (std::vector<int>{1, 2}));
}

TEST(CudaMask, UuidPrefixes) {
  const VisibleDevices m =
      parse_visible_devices(MaskKind::kCuda, "GPU-8932f937,GPU-7777", four_gpus());
  EXPECT_EQ(m.physical, (std::vector<int>{0, 3}));
}

TEST(CudaMask, AmbiguousUuidPrefixStops) {
  // GPU-1a2b starts both GPU 1's and GPU 2's UUID.
  const VisibleDevices m = parse_visible_devices(MaskKind::kCuda, "0,GPU-1a2b,3", four_gpus());
  EXPECT_EQ(m.physical, (std::vector<int>{0}));
  EXPECT_EQ(m.ignored, "GPU-1a2b,3");
}

TEST(CudaMask, MigDeviceMapsToItsParent) {
  const VisibleDevices m = parse_visible_devices(
      MaskKind::kCuda, "MIG-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", four_gpus());
  EXPECT_EQ(m.physical, (std::vector<int>{3}));
}

TEST(CudaMask, RepeatedDeviceEmptiesTheList) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kCuda, "0,1,0", four_gpus());
  EXPECT_TRUE(m.hides_all());
  EXPECT_NE(m.violation.find("twice"), std::string::npos);
}

TEST(CudaMask, EmptyMeansNoDevice) {
  EXPECT_TRUE(parse_visible_devices(MaskKind::kCuda, "", four_gpus()).hides_all());
}

TEST(CudaMask, UuidWithoutDeviceListIsKeptUnresolved) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kCuda, "GPU-abc", DeviceInventory{});
  EXPECT_EQ(m.physical, (std::vector<int>{-1}));
}

TEST(HipMask, IndicesOnly) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kHip, "1,GPU-8932f937", four_gpus());
  EXPECT_EQ(m.physical, (std::vector<int>{1}));
  EXPECT_EQ(m.ignored, "GPU-8932f937");
}

TEST(RocrMask, AcceptsUuids) {
  const VisibleDevices m = parse_visible_devices(MaskKind::kRocr, "GPU-7777,0", four_gpus());
  EXPECT_EQ(m.physical, (std::vector<int>{3, 0}));
}

TEST(MaskNames, RayVariables) {
  EXPECT_EQ(ray_noset_variable(MaskKind::kAscend),
            "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES");
  EXPECT_EQ(ray_noset_variable(MaskKind::kRocr), "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES");
}

}  // namespace
}  // namespace ferry::device

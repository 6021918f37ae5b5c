// The pieces the demo and the benchmarks are built from (src/tools).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/status_matchers.h"
#include "tools/child_process.h"
#include "tools/host_buffer.h"
#include "tools/ucx_perftest.h"

namespace ferry::tools {
namespace {

TEST(HostBuffer, LaysTensorsOutBackToBack) {
  const std::vector<TensorSpec> specs = {{"a", DType::kF32, {3}}, {"b", DType::kBF16, {2, 5}}};
  auto region = map_anonymous(specs[0].bytes() + specs[1].bytes(), /*dont_fork=*/true,
                              /*prefault=*/true);
  ASSERT_OK(region);
  ASSERT_EQ(region->size(), 12u + 20u);
  const std::vector<TensorView> views = lay_out(specs, region->data());
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0].spec.name, "a");
  EXPECT_EQ(views[0].data.data(), region->data());
  EXPECT_EQ(views[0].data.size(), 12u);
  EXPECT_EQ(views[1].data.data(), region->data() + 12);
  EXPECT_EQ(views[1].data.size(), 20u);
}

TEST(HostBuffer, ZeroBytesMapsNothing) {
  auto region = map_anonymous(0, false, false);
  ASSERT_OK(region);
  EXPECT_EQ(region->size(), 0u);
}

TEST(ChildProcess, ReturnsWhatTheChildComputed) {
  const std::string parent_value = "computed in the parent, read in the child";
  auto kid = fork_child([&] { return parent_value + " " + std::to_string(6 * 7); });
  ASSERT_OK(kid);
  auto out = finish_child(*kid);
  ASSERT_OK(out);
  EXPECT_EQ(*out, parent_value + " 42");
}

TEST(ChildProcess, AChildKilledByASignalIsAnError) {
  auto kid = fork_child([]() -> std::string {
    ::raise(SIGKILL);
    return "never";
  });
  ASSERT_OK(kid);
  auto out = finish_child(*kid);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kAborted);
  EXPECT_NE(out.status().message().find("signal 9"), std::string::npos) << out.status().to_string();
}

TEST(ChildProcess, PeakRssCountsTouchedMemory) {
  const std::uint64_t before = peak_rss_bytes();
  EXPECT_GT(before, 0u);
  std::vector<char> big(64u << 20);
  std::memset(big.data(), 1, big.size());
  EXPECT_GE(peak_rss_bytes(), before + (32u << 20));
}

TEST(UcxPerftest, FreeLoopbackPortIsAPort) {
  const int port = free_loopback_port();
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
}

}  // namespace
}  // namespace ferry::tools

// `ferry plan` from the command line: a prediction in JSON, and errors naming the option.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace ferry::plan {
namespace {

using testing::run_ferry;

TEST(PlanCli, PrintsAPredictionAsJson) {
  auto r = run_ferry({"plan", "--preset", "qwen2.5-0.5b", "--nodes", "4", "--nic-gbps", "100",
                      "--topology", "chain", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["seconds"].get<double>(), 0);
  EXPECT_EQ(j["cluster"]["topology"], "chain");
  EXPECT_EQ(j["calibration"], "defaults");
  EXPECT_FALSE(j["bottleneck"].get<std::string>().empty());
  EXPECT_EQ(j["depth"], 4);
}

TEST(PlanCli, SaysWhenItUsesTheDefaults) {
  auto r = run_ferry({"plan", "--params", "7e9", "--nic-gbps", "200"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("built-in defaults"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bottleneck"), std::string::npos) << r.out;
}

TEST(PlanCli, ErrorsNameTheOption) {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{"plan", "--preset", "qwen2.5-0.5b", "--nic-gbps", "-5"}, "--nic-gbps"},
      {{"plan", "--preset", "qwen2.5-0.5b", "--nic-gbps", "100", "--topology", "ring"},
       "--topology"},
      {{"plan", "--preset", "no-such-model", "--nic-gbps", "100"}, "--preset"},
      {{"plan", "--nic-gbps", "100"}, "--preset"},
      {{"plan", "--params", "1e9", "--dtype", "int3", "--nic-gbps", "100"}, "--dtype"},
      {{"plan", "--params", "1e9", "--nic-gbps", "100", "--nodes", "0"}, "--nodes"},
      {{"plan", "--params", "1e9", "--nic-gbps", "100", "--delta-density", "2"}, "--delta-density"},
      {{"plan", "--params", "1e9", "--nic-gbps", "100", "--sender-nodes", "2"}, "--sender-nodes"},
  };
  for (const Case& c : cases) {
    auto r = run_ferry(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.names << ": " << r.err;
    EXPECT_NE(r.err.find(c.names), std::string::npos) << r.err;
  }
}

TEST(PlanCli, ABadCalibrationFileNamesTheFileAndField) {
  testing::TempDir dir;
  const std::string path = dir.file("calibration.json");
  testing::write_bytes(path, "{\"format\": \"ferry-plan-calibration\", \"version\": 1}");
  auto r =
      run_ferry({"plan", "--preset", "qwen2.5-0.5b", "--nic-gbps", "100", "--calibration", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("memcpy_gbps"), std::string::npos) << r.err;
}

// A bad --net-from file is refused before anything is measured (seconds of memcpy and a
// round), naming the file and the field.
TEST(PlanCli, CalibrateRefusesABadNetRoundFileBeforeMeasuring) {
  testing::TempDir dir;
  const std::string path = dir.file("node.json");
  testing::write_bytes(path, R"({"role": "node", "nodes": 1})");
  auto r = run_ferry({"plan", "calibrate", "--out", dir.file("c.json"), "--net-from", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'role'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("calibrate: memcpy"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ferry::plan

// The calibration file: what `ferry plan calibrate` writes, `ferry plan --calibration` reads
// back unchanged, and a bad file is refused naming the field.
#include "plan/calibration.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::plan {
namespace {

Calibration measured() {
  Calibration c = default_calibration();
  c.source = "measured";
  c.measured_at = "2026-12-05T01:58:12Z";
  c.load_average = 3.5;
  c.memcpy_gbps = 11.25;
  c.net_round_gbps = 0.75;
  c.net_cpu_fixed_s = 0.25;
  c.net_cpu_per_node_s = 1.5;
  c.delta_ratios = {{0.01, 0.02}, {1.0, 1.0}};
  return c;
}

// The file's JSON with one edit applied.
std::string edited(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(calibration_to_json(measured()));
  edit(j);
  return j.dump();
}

void expect_refused(const std::string& text, const std::string& field) {
  auto c = calibration_from_json(text);
  ASSERT_FALSE(c.ok()) << field;
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status().message();
}

TEST(Calibration, RoundTripsThroughAFile) {
  testing::TempDir dir;
  const std::string path = dir.file("calibration.json");
  const Calibration c = measured();
  ASSERT_OK(write_calibration(path, c));
  auto back = read_calibration(path);
  ASSERT_OK(back);
  EXPECT_EQ(back->source, "measured");
  EXPECT_EQ(back->measured_at, c.measured_at);
  EXPECT_DOUBLE_EQ(back->load_average, 3.5);
  EXPECT_DOUBLE_EQ(back->memcpy_gbps, 11.25);
  EXPECT_DOUBLE_EQ(back->net_round_gbps, 0.75);
  EXPECT_DOUBLE_EQ(back->net_limit_gbps, c.net_limit_gbps);
  EXPECT_DOUBLE_EQ(back->net_cpu_fixed_s, 0.25);
  EXPECT_DOUBLE_EQ(back->net_cpu_per_node_s, 1.5);
  EXPECT_EQ(back->bytes, c.bytes);
  EXPECT_EQ(back->delta_ratios, c.delta_ratios);
}

TEST(Calibration, DefaultsAreValid) { EXPECT_OK(validate(default_calibration())); }

TEST(Calibration, RefusesAMissingField) {
  expect_refused(edited([](nlohmann::json& j) { j.erase("shm_round_gbps"); }), "shm_round_gbps");
  expect_refused(edited([](nlohmann::json& j) { j.erase("delta_ratios"); }), "delta_ratios");
}

// Files written before the CPU split lack it: read as not measured, not refused.
TEST(Calibration, ReadsAFileWithoutTheCpuSplitAsUnmeasured) {
  auto c = calibration_from_json(edited([](nlohmann::json& j) {
    j.erase("net_cpu_fixed_s");
    j.erase("net_cpu_per_node_s");
  }));
  ASSERT_OK(c);
  EXPECT_EQ(c->net_cpu_fixed_s, 0.0);
  EXPECT_EQ(c->net_cpu_per_node_s, 0.0);
  expect_refused(edited([](nlohmann::json& j) { j["net_cpu_per_node_s"] = -2; }),
                 "net_cpu_per_node_s");
}

TEST(Calibration, RefusesAnotherVersionOrFormat) {
  expect_refused(edited([](nlohmann::json& j) { j["version"] = 2; }), "version");
  expect_refused(edited([](nlohmann::json& j) { j.erase("version"); }), "version");
  expect_refused(edited([](nlohmann::json& j) { j["format"] = "something-else"; }), "format");
}

TEST(Calibration, RefusesANegativeOrNonNumericRate) {
  expect_refused(edited([](nlohmann::json& j) { j["net_round_gbps"] = -1.5; }), "net_round_gbps");
  expect_refused(edited([](nlohmann::json& j) { j["memcpy_gbps"] = 0; }), "memcpy_gbps");
  expect_refused(edited([](nlohmann::json& j) { j["net_limit_gbps"] = "fast"; }), "net_limit_gbps");
}

TEST(Calibration, RefusesADeltaTableOutOfOrder) {
  expect_refused(edited([](nlohmann::json& j) {
                   j["delta_ratios"] = nlohmann::json::array({{0.5, 0.6}, {0.1, 0.2}});
                 }),
                 "delta_ratios[1]");
  expect_refused(edited([](nlohmann::json& j) { j["delta_ratios"] = {{0.5}}; }), "delta_ratios[0]");
}

TEST(Calibration, RefusesWhatIsNotJsonAndNamesAMissingFile) {
  auto c = calibration_from_json("{\"format\": ");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("not JSON"), std::string::npos);
  auto missing = read_calibration("/nonexistent/calibration.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/calibration.json"), std::string::npos);
}

TEST(Calibration, DeltaRatioInterpolatesBetweenPoints) {
  Calibration c = default_calibration();
  c.delta_ratios = {{0.01, 0.02}, {0.1, 0.2}, {1.0, 1.0}};
  EXPECT_DOUBLE_EQ(delta_ratio(c, 0.01), 0.02);
  EXPECT_DOUBLE_EQ(delta_ratio(c, 0.001), 0.02);  // below the table: its first ratio
  EXPECT_NEAR(delta_ratio(c, 0.055), 0.11, 1e-12);
  EXPECT_DOUBLE_EQ(delta_ratio(c, 1.0), 1.0);
}

// The sender's line of `ferry bench sync --net --listen ... --json`, as the bench prints it.
constexpr const char* kSenderLine =
    R"({"dtype":"BF16","bucket_mb":64,"nodes":1,"wire_protect":"none","ratio_to_none":1.0,)"
    R"("tensors":290,"bytes":988065536,"seconds":1.0656,"gbps_per_node":0.927,)"
    R"("perftest_gbps":0.0,"perftest_mode":"","role":"sender"})";

TEST(Calibration, TakesANetRoundFromABenchSenderLine) {
  auto r = net_round_from_bench_json(kSenderLine);
  ASSERT_OK(r);
  EXPECT_DOUBLE_EQ(r->gbps_per_node, 0.927);
  EXPECT_EQ(r->perftest_gbps, 0.0);
  EXPECT_EQ(r->bytes, 988065536u);
  EXPECT_EQ(r->node_cpu, 0.0);  // the line has no CPU figures: left unmeasured
  nlohmann::json j = nlohmann::json::parse(kSenderLine);
  j["sender_cpu_user_s_per_round"] = 0.6;
  j["sender_cpu_sys_s_per_round"] = 0.3;
  j["node_cpu_s_per_round"] = 1.2;
  auto with_cpu = net_round_from_bench_json(j.dump());
  ASSERT_OK(with_cpu);
  EXPECT_DOUBLE_EQ(with_cpu->sender_cpu_user, 0.6);
  EXPECT_DOUBLE_EQ(with_cpu->sender_cpu_sys, 0.3);
  EXPECT_DOUBLE_EQ(with_cpu->node_cpu, 1.2);
}

TEST(Calibration, RefusesABenchLineThatIsNotOneNodesSenderLine) {
  auto refused = [](const std::function<void(nlohmann::json&)>& edit, const std::string& field) {
    nlohmann::json j = nlohmann::json::parse(kSenderLine);
    edit(j);
    auto r = net_round_from_bench_json(j.dump());
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("'" + field + "'"), std::string::npos)
        << r.status().message();
  };
  refused([](nlohmann::json& j) { j["role"] = "node"; }, "role");
  refused([](nlohmann::json& j) { j["nodes"] = 2; }, "nodes");
  refused([](nlohmann::json& j) { j["gbps_per_node"] = 0; }, "gbps_per_node");
  refused([](nlohmann::json& j) { j.erase("gbps_per_node"); }, "gbps_per_node");
  refused([](nlohmann::json& j) { j["bytes"] = "many"; }, "bytes");
  refused([](nlohmann::json& j) { j["node_cpu_s_per_round"] = -1; }, "node_cpu_s_per_round");
  auto missing = read_net_round("/nonexistent/sender.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/sender.json"), std::string::npos);
}

}  // namespace
}  // namespace ferry::plan

// `ferry trace summarize` and `ferry trace config` through the built binary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace ferry::profiler {
namespace {

using ::testing::HasSubstr;

constexpr const char* kTrace = R"({"traceEvents":[
{"name":"sync.pack","ph":"X","ts":0,"dur":10,"pid":1,"tid":1},
{"name":"sync.pack","ph":"X","ts":20,"dur":30,"pid":1,"tid":1},
{"name":"sync.publish","ph":"X","ts":60,"dur":40,"pid":1,"tid":1}]})";

class TraceCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(FERRY_BINARY, X_OK) != 0) GTEST_SKIP() << "build ferry_cli first";
  }
};

TEST_F(TraceCli, SummarizeMarkdownCsvJson) {
  testing::TempDir dir;
  testing::write_bytes(dir.file("t.json"), kTrace);
  auto md = testing::run_ferry({"trace", "summarize", dir.file("t.json")});
  ASSERT_EQ(md.exit_code, 0) << md.err;
  EXPECT_THAT(md.out,
              HasSubstr("| sync.pack | 2 | 0.040 | 20.000 | 10.000 | 30.000 | 30.000 | 40.0% |"));
  auto csv = testing::run_ferry({"trace", "summarize", "--csv", dir.file("t.json")});
  ASSERT_EQ(csv.exit_code, 0);
  EXPECT_THAT(csv.out, HasSubstr("sync.publish,1,40.000,"));
  auto js = testing::run_ferry({"trace", "summarize", "--json", dir.file("t.json")});
  ASSERT_EQ(js.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(js.out)["spans"][0]["name"], "sync.pack");
}

TEST_F(TraceCli, SummarizeErrors) {
  testing::TempDir dir;
  testing::write_bytes(dir.file("bad.json"), "{nope");
  auto bad = testing::run_ferry({"trace", "summarize", dir.file("bad.json")});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("bad.json"));
  auto missing = testing::run_ferry({"trace", "summarize", dir.file("none.json")});
  EXPECT_EQ(missing.exit_code, 2);
}

TEST_F(TraceCli, ConfigPrintsVerlSpelling) {
  const std::string p = "actor_rollout_ref.actor.profiler.tool_config.npu.";
  auto r = testing::run_ferry({"trace", "config", p + "level=1", p + "contents=npu,cpu"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(p + "level=level1"));
  EXPECT_THAT(r.out, HasSubstr(p + "contents=[npu,cpu]"));
  EXPECT_THAT(r.err, HasSubstr("redundant"));
  auto bad = testing::run_ferry({"trace", "config", p + "level=9"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("level_none, level0, level1, level2"));
}

}  // namespace
}  // namespace ferry::profiler

// Summary numbers on synthetic traces with known durations.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "base/file_util.h"
#include "ferry/profiler.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::profiler {
namespace {

using ::testing::HasSubstr;

// 100 "sync.pack" spans of 1..100 us and one "sync.publish" of 50 us inside a 1000 us step.
std::string synthetic_trace(int rank, long long anchor_ns) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"tid", 0}});
  events.push_back({{"name", "ferry.step"},
                    {"cat", "ferry"},
                    {"ph", "b"},
                    {"ts", 0},
                    {"pid", 1},
                    {"tid", 1},
                    {"id", "0x1"}});
  events.push_back({{"name", "ferry.step"},
                    {"cat", "ferry"},
                    {"ph", "e"},
                    {"ts", 1000},
                    {"pid", 1},
                    {"tid", 1},
                    {"id", "0x1"}});
  for (int i = 1; i <= 100; ++i) {
    events.push_back(
        {{"name", "sync.pack"}, {"ph", "X"}, {"ts", 10 + i}, {"dur", i}, {"pid", 1}, {"tid", 2}});
  }
  events.push_back(
      {{"name", "sync.publish"}, {"ph", "X"}, {"ts", 500}, {"dur", 50}, {"pid", 1}, {"tid", 2}});
  nlohmann::json doc = {{"traceEvents", events},
                        {"otherData",
                         {{"ferry",
                           {{"rank", rank},
                            {"role", "actor"},
                            {"step", 3},
                            {"wall_minus_monotonic_ns", anchor_ns}}}}}};
  return doc.dump();
}

// The stats of span `name`; when the summary lacks it, a test failure and empty stats.
const SpanStats& span(const Summary& s, const std::string& name) {
  for (const SpanStats& st : s.spans) {
    if (st.name == name) return st;
  }
  ADD_FAILURE() << "no span '" << name << "' in the summary";
  static const SpanStats kMissing;
  return kMissing;
}

TEST(ProfilerAnalysis, KnownDurations) {
  auto s = summarize_text(synthetic_trace(0, 0), "t.json");
  ASSERT_OK(s);
  EXPECT_DOUBLE_EQ(s->step_us, 1000);
  const SpanStats& pack = span(*s, "sync.pack");
  EXPECT_EQ(pack.count, 100u);
  EXPECT_DOUBLE_EQ(pack.total_us, 5050);
  EXPECT_DOUBLE_EQ(pack.mean_us, 50.5);
  EXPECT_DOUBLE_EQ(pack.p50_us, 50);
  EXPECT_DOUBLE_EQ(pack.p99_us, 99);
  EXPECT_DOUBLE_EQ(pack.max_us, 100);
  EXPECT_DOUBLE_EQ(pack.share, 5.05);  // spans on many threads may exceed the step
  const SpanStats& step = span(*s, "ferry.step");
  EXPECT_DOUBLE_EQ(step.total_us, 1000);
  EXPECT_DOUBLE_EQ(step.share, 1.0);
  const SpanStats& publish = span(*s, "sync.publish");
  EXPECT_DOUBLE_EQ(publish.share, 0.05);
  EXPECT_EQ(s->spans.front().name, "sync.pack");  // largest total first
}

TEST(ProfilerAnalysis, MergesRanksAndReportsClockOffsets) {
  testing::TempDir dir;
  testing::write_bytes(dir.file("r0.json"), synthetic_trace(0, 1'000'000));
  testing::write_bytes(dir.file("r1.json"), synthetic_trace(1, 1'000'000 - 2'500'000));
  auto s = summarize_files({dir.file("r0.json"), dir.file("r1.json")});
  ASSERT_OK(s);
  ASSERT_EQ(s->files.size(), 2u);
  EXPECT_EQ(s->files[1].rank, 1);
  EXPECT_DOUBLE_EQ(s->files[0].clock_offset_us, 0);
  EXPECT_DOUBLE_EQ(s->files[1].clock_offset_us, 2500);
  EXPECT_DOUBLE_EQ(s->step_us, 2000);
  const SpanStats& pack = span(*s, "sync.pack");
  EXPECT_EQ(pack.count, 200u);
  EXPECT_DOUBLE_EQ(pack.p50_us, 50);
  EXPECT_DOUBLE_EQ(pack.share, 5.05);
}

TEST(ProfilerAnalysis, MarkdownCsvJson) {
  auto s = summarize_text(synthetic_trace(0, 0), "t.json");
  ASSERT_OK(s);
  const std::string md = summary_markdown(*s);
  EXPECT_THAT(md, HasSubstr("| sync.pack | 100 | 5.050 | 50.500 | 50.000 | 99.000 | 100.000 |"));
  const std::string csv = summary_csv(*s);
  EXPECT_THAT(csv, HasSubstr("span,count,total_us,mean_us,p50_us,p99_us,max_us,share\n"));
  EXPECT_THAT(csv, HasSubstr("sync.publish,1,50.000,50.000,50.000,50.000,50.000,0.050000\n"));
  auto j = nlohmann::json::parse(summary_json(*s));
  EXPECT_EQ(j["spans"][0]["name"], "sync.pack");
}

TEST(ProfilerAnalysis, RejectsNonTraces) {
  EXPECT_EQ(summarize_text("{not json", "a.json").status().code(), Code::kCorruption);
  auto s = summarize_text("{\"foo\":1}", "b.json");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("b.json"));
  EXPECT_EQ(summarize_files({}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(summarize_files({"/nonexistent/x.json"}).status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace ferry::profiler

namespace ferry::profiler {
namespace {

TEST(ProfilerMerge, ShiftsOtherNodesOntoTheFirstClock) {
  testing::TempDir dir;
  auto trace = [](const std::string& host, long long anchor, double ts) {
    nlohmann::json doc = {
        {"traceEvents", {{{"name", "s"}, {"ph", "X"}, {"ts", ts}, {"dur", 1}, {"pid", 1}}}},
        {"otherData", {{"ferry", {{"host", host}, {"wall_minus_monotonic_ns", anchor}}}}}};
    return doc.dump();
  };
  testing::write_bytes(dir.file("a.json"), trace("n0", 5'000'000, 100));
  testing::write_bytes(dir.file("b.json"), trace("n0", 5'000'700, 100));  // same node: no shift
  testing::write_bytes(dir.file("c.json"), trace("n1", 3'000'000, 100));  // 2 ms behind
  ASSERT_OK(merge_traces({dir.file("a.json"), dir.file("b.json"), dir.file("c.json")},
                         dir.file("m.json")));
  auto text = read_file(dir.file("m.json"));
  ASSERT_OK(text);
  auto m = nlohmann::json::parse(*text);
  ASSERT_EQ(m["traceEvents"].size(), 3u);
  EXPECT_DOUBLE_EQ(m["traceEvents"][0]["ts"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(m["traceEvents"][1]["ts"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(m["traceEvents"][2]["ts"].get<double>(), 100 - 2000);
  EXPECT_EQ(merge_traces({dir.file("none.json")}, dir.file("x.json")).code(), Code::kNotFound);
}

}  // namespace
}  // namespace ferry::profiler

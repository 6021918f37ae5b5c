// Sessions: trace JSON that parses, discrete vs continuous file sets, budget dropping,
// content options and many recording threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "base/file_util.h"
#include "ferry/profiler.h"
#include "profiler/span.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::profiler {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

nlohmann::json load(const std::string& path) {
  auto text = read_file(path);
  EXPECT_OK(text) << path;
  return nlohmann::json::parse(*text);  // throws (and fails the test) if invalid
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename());
  return out;
}

int count_named(const nlohmann::json& doc, const std::string& name, const std::string& ph) {
  int n = 0;
  for (const auto& e : doc["traceEvents"]) n += e["name"] == name && e["ph"] == ph;
  return n;
}

Config config_in(const testing::TempDir& dir) {
  Config c;
  c.enable = true;
  c.save_path = dir.file("prof");
  return c;
}

void one_round() {
  Span round("sync.round");
  {
    Span pack("sync.pack");
    pack.arg("bucket", 3);
  }
  auto wait = range_start("sync.wait_release");
  mark("sync.filled");
  counter("sync.slots_free", 2);
  range_end(wait);
}

TEST(ProfilerTrace, DisabledSpansRecordNothing) {
  EXPECT_FALSE(enabled());
  Span s("nothing");
  EXPECT_FALSE(s.active());
}

TEST(ProfilerTrace, ContinuousWritesOneTracePerStep) {
  testing::TempDir dir;
  auto session = Session::start(config_in(dir), {2, "sender"});
  ASSERT_OK(session);
  for (int step = 0; step < 2; ++step) {
    (*session)->begin_step(step);
    for (int t = 0; t < 2; ++t) {
      (*session)->begin_task("sync_round");
      one_round();
      auto none = (*session)->end_task();
      ASSERT_OK(none);
      EXPECT_TRUE(none->empty());
    }
    auto files = (*session)->end_step();
    ASSERT_OK(files);
    ASSERT_EQ(files->size(), 1u);
  }
  ASSERT_OK((*session)->stop());
  EXPECT_THAT(names_in(dir.file("prof")),
              UnorderedElementsAre("ferry_trace_rank2_sender_step0.json",
                                   "ferry_trace_rank2_sender_step1.json"));
  nlohmann::json doc = load(dir.file("prof/ferry_trace_rank2_sender_step1.json"));
  EXPECT_EQ(doc["otherData"]["ferry"]["rank"], 2);
  EXPECT_EQ(doc["otherData"]["ferry"]["role"], "sender");
  EXPECT_EQ(doc["otherData"]["ferry"]["step"], 1);
  EXPECT_EQ(count_named(doc, "sync.pack", "X"), 2);
  EXPECT_EQ(count_named(doc, "sync.round", "X"), 2);
  EXPECT_EQ(count_named(doc, "sync.wait_release", "b"), 2);
  EXPECT_EQ(count_named(doc, "sync.wait_release", "e"), 2);
  EXPECT_EQ(count_named(doc, "task.sync_round", "b"), 2);
  EXPECT_EQ(count_named(doc, "ferry.step", "b"), 1);
  EXPECT_EQ(count_named(doc, "sync.filled", "i"), 2);
  EXPECT_EQ(count_named(doc, "sync.slots_free", "C"), 2);
  for (const auto& e : doc["traceEvents"]) {
    if (e["name"] == "sync.pack") {
      EXPECT_EQ(e["args"]["bucket"], 3);
    }
  }
}

TEST(ProfilerTrace, DiscreteWritesOneTracePerTaskWithSummaries) {
  testing::TempDir dir;
  Config c = config_in(dir);
  c.discrete = true;
  c.analysis = true;
  auto session = Session::start(c, {0, "actor"});
  ASSERT_OK(session);
  (*session)->begin_step(5);
  (*session)->begin_task("sync_round");
  one_round();
  auto f1 = (*session)->end_task();
  (*session)->begin_task("ckpt_save");
  { Span save("checkpoint.save"); }
  auto f2 = (*session)->end_task();
  ASSERT_TRUE(f1.ok() && f2.ok());
  EXPECT_EQ(f1->size(), 3u);  // trace, .summary.md, .summary.csv
  auto f3 = (*session)->end_step();
  ASSERT_OK(f3);
  ASSERT_OK((*session)->stop());
  std::set<std::string> names = names_in(dir.file("prof"));
  EXPECT_TRUE(names.count("ferry_trace_rank0_actor_step5_task000_sync_round.json"));
  EXPECT_TRUE(names.count("ferry_trace_rank0_actor_step5_task000_sync_round.summary.md"));
  EXPECT_TRUE(names.count("ferry_trace_rank0_actor_step5_task000_sync_round.summary.csv"));
  EXPECT_TRUE(names.count("ferry_trace_rank0_actor_step5_task001_ckpt_save.json"));
  nlohmann::json a = load(dir.file("prof/ferry_trace_rank0_actor_step5_task000_sync_round.json"));
  nlohmann::json b = load(dir.file("prof/ferry_trace_rank0_actor_step5_task001_ckpt_save.json"));
  EXPECT_EQ(count_named(a, "sync.pack", "X"), 1);
  EXPECT_EQ(count_named(b, "sync.pack", "X"), 0);
  EXPECT_EQ(count_named(b, "checkpoint.save", "X"), 1);
  EXPECT_EQ(b["otherData"]["ferry"]["task"], "ckpt_save");
  auto md = read_file(dir.file("prof/ferry_trace_rank0_actor_step5_task000_sync_round.summary.md"));
  EXPECT_THAT(*md, HasSubstr("| sync.pack | 1 |"));
}

TEST(ProfilerTrace, BudgetDropsOldestAndSaysSo) {
  testing::TempDir dir;
  Config c = config_in(dir);
  c.trace_budget_bytes = 16 * 1024;
  auto session = Session::start(c, {0, "actor"});
  ASSERT_OK(session);
  (*session)->begin_step(0);
  for (int i = 0; i < 2000; ++i) {
    Span s("sync.copy_out");
    s.arg("i", i);
  }
  auto files = (*session)->end_step();
  ASSERT_OK(files);
  ASSERT_EQ(files->size(), 1u);
  ASSERT_OK((*session)->stop());
  const std::string path = (*files)[0];
  EXPECT_LE(std::filesystem::file_size(path), c.trace_budget_bytes);
  nlohmann::json doc = load(path);
  const auto& ferry = doc["otherData"]["ferry"];
  EXPECT_GT(ferry["dropped_events"].get<int>(), 0);
  EXPECT_THAT(ferry["note"].get<std::string>(), HasSubstr("oldest events dropped"));
  EXPECT_EQ(count_named(doc, "ferry.trace_truncated", "i"), 1);
  // The newest spans survive: the last one recorded is there, the first is not.
  std::set<int> kept;
  for (const auto& e : doc["traceEvents"]) {
    if (e["name"] == "sync.copy_out") kept.insert(e["args"]["i"].get<int>());
  }
  EXPECT_TRUE(kept.count(1999));
  EXPECT_FALSE(kept.count(0));
}

TEST(ProfilerTrace, ContentsAndLevels) {
  testing::TempDir dir;
  Config c = config_in(dir);
  c.contents = {Content::kMemory, Content::kShapes, Content::kStack, Content::kModule};
  c.level = Level::kLevel1;
  auto session = Session::start(c, {0, "actor"});
  ASSERT_OK(session);
  (*session)->begin_step(0);
  {
    Span bucket("sync.bucket", Detail::kBucket);
    const std::int64_t dims[] = {151936, 4096};
    bucket.shape("model.embed_tokens.weight", "BF16", dims);
    Span tensor("sync.tensor", Detail::kTensor);  // level2 only
    EXPECT_FALSE(tensor.active());
  }
  auto files = (*session)->end_step();
  ASSERT_OK(files);
  ASSERT_OK((*session)->stop());
  nlohmann::json doc = load((*files)[0]);
  EXPECT_EQ(count_named(doc, "sync.tensor", "X"), 0);
  ASSERT_EQ(count_named(doc, "sync.bucket", "X"), 1);
  EXPECT_GE(count_named(doc, "rss_kb", "C"), 2);
  for (const auto& e : doc["traceEvents"]) {
    if (e["name"] != "sync.bucket") continue;
    EXPECT_EQ(e["cat"], "sync");
    EXPECT_EQ(e["args"]["model.embed_tokens.weight"], "BF16[151936,4096]");
    EXPECT_THAT(e["args"]["site"].get<std::string>(), HasSubstr("trace_test.cc:"));
    EXPECT_GT(e["args"]["rss_end_kb"].get<long>(), 0);
  }
}

TEST(ProfilerTrace, TextThatIsNotUtf8StillYieldsStrictJson) {
  testing::TempDir dir;
  auto session = Session::start(config_in(dir), {0, "actor"});
  ASSERT_OK(session);
  (*session)->begin_step(0);
  // A name from a tensor or file, cut mid-character or in Latin-1, reaches the trace as-is.
  const char* bad_name = intern("sync.\xff\xfe tensor \xc3");
  {
    Span s(bad_name);
    s.arg("file \xe9", "caf\xe9 \"quoted\" \\ new\nline \x01");
    s.arg("ok", "\xce\xb1");  // valid UTF-8 (alpha) stays as it is
  }
  mark(bad_name);
  auto files = (*session)->end_step();
  ASSERT_OK(files);
  ASSERT_OK((*session)->stop());
  nlohmann::json doc = load((*files)[0]);  // nlohmann's parser rejects invalid UTF-8
  const std::string replaced = "sync.\xef\xbf\xbd\xef\xbf\xbd tensor \xef\xbf\xbd";  // U+FFFD
  EXPECT_EQ(count_named(doc, replaced, "X"), 1);
  EXPECT_EQ(count_named(doc, replaced, "i"), 1);
  for (const auto& e : doc["traceEvents"]) {
    if (e["name"] != replaced || e["ph"] != "X") continue;
    EXPECT_EQ(e["args"]["file \xef\xbf\xbd"], "caf\xef\xbf\xbd \"quoted\" \\ new\nline \x01");
    EXPECT_EQ(e["args"]["ok"], "\xce\xb1");
  }
}

TEST(ProfilerTrace, OneSessionAtATime) {
  testing::TempDir dir;
  auto a = Session::start(config_in(dir), {0, "actor"});
  ASSERT_OK(a);
  auto b = Session::start(config_in(dir), {0, "actor"});
  EXPECT_EQ(b.status().code(), Code::kFailedPrecondition);
}

TEST(ProfilerTrace, ManyThreadsRecordConcurrently) {
  testing::TempDir dir;
  auto session = Session::start(config_in(dir), {0, "actor"});
  ASSERT_OK(session);
  (*session)->begin_step(0);
  constexpr int kThreads = 4, kSpans = 3000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < kSpans; ++i) {
        Span s("worker.span");
        if (i % 100 == 0) mark("worker.mark");
      }
    });
  }
  for (auto& th : threads) th.join();
  auto files = (*session)->end_step();
  ASSERT_OK(files);
  ASSERT_OK((*session)->stop());
  nlohmann::json doc = load((*files)[0]);
  const int dropped = doc["otherData"]["ferry"]["dropped_events"].get<int>();
  EXPECT_EQ(count_named(doc, "worker.span", "X") + count_named(doc, "worker.mark", "i") + dropped,
            kThreads * kSpans + kThreads * (kSpans / 100));
  std::set<int> tids;
  for (const auto& e : doc["traceEvents"]) {
    if (e["name"] == "worker.span") tids.insert(e["tid"].get<int>());
  }
  EXPECT_EQ(tids.size(), static_cast<std::size_t>(kThreads));
}

}  // namespace
}  // namespace ferry::profiler

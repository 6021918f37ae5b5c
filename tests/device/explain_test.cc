// `ferry explain` on every error verl's Ascend FAQ lists, through the CLI.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "base/file_util.h"
#include "ferry/device.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::testing {
namespace {

struct Explained {
  int exit_code = -1;
  std::string out, err;
  nlohmann::json json;
};

Explained explain_json(const std::string& text) {
  const CommandResult r = run_ferry({"explain", "--json", text});
  Explained e{r.exit_code, r.out, r.err, nlohmann::json::parse(r.out, nullptr, false)};
  return e;
}

// Passes when `ferry explain` exited 0 and found exactly one error in the text: `id`.
::testing::AssertionResult explained_as(const Explained& e, const std::string& id) {
  if (e.exit_code != 0) {
    return ::testing::AssertionFailure() << "exit code " << e.exit_code << ": " << e.err;
  }
  if (e.json.size() != 1) {
    return ::testing::AssertionFailure() << e.json.size() << " errors found, not 1: " << e.out;
  }
  if (e.json[0]["id"] != id) {
    return ::testing::AssertionFailure() << "found " << e.json[0]["id"] << ", not " << id;
  }
  return ::testing::AssertionSuccess();
}

std::string fixes(const nlohmann::json& item) {
  std::string all;
  for (const auto& f : item["fix"]) all += f.get<std::string>() + "\n";
  return all;
}

TEST(Explain, NpuNotVisible) {
  const Explained e =
      explain_json("RuntimeError: torch_npu detected, but NPU device is not available or visible.");
  ASSERT_TRUE(explained_as(e, "npu.not_visible"));
  const std::string fix = fixes(e.json[0]);
  EXPECT_NE(fix.find("export ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"), std::string::npos);
  EXPECT_NE(fix.find("export RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1"),
            std::string::npos);
  EXPECT_NE(fix.find("npu-smi info"), std::string::npos);
}

TEST(Explain, QLayernormKeyErrorMeansOldMindSpeed) {
  const Explained e =
      explain_json("KeyError: 'decoder.layers.12.self_attention.q_layernorm.weight'");
  ASSERT_TRUE(explained_as(e, "mindspeed.q_layernorm_keyerror"));
  EXPECT_NE(e.json[0]["cause"].get<std::string>().find("layer 12"), std::string::npos);
  EXPECT_NE(fixes(e.json[0]).find("git checkout 2.3.0_core_r0.12.1"), std::string::npos);
}

TEST(Explain, FaqKeyErrorWithoutQuotes) {
  const Explained e = explain_json("KeyError: decoder.layers.0.self_attention.q_layernorm.weight");
  ASSERT_TRUE(explained_as(e, "mindspeed.q_layernorm_keyerror"));
}

TEST(Explain, BucketTooSmallComputesTheSize) {
  // verl's message as it prints it (no space after the first sentence).
  const Explained e = explain_json(
      "AssertionError: Weight model.embed_tokens.weight(torch.Size([151936, 4096]), torch.float32) "
      "is "
      "too large to fit in the bucket.Please increase rollout.update_weights_bucket_megabytes(2048 "
      "MB).");
  ASSERT_TRUE(explained_as(e, "verl.bucket_too_small"));
  const auto& x = e.json[0];
  const std::string cause = x["cause"];
  // 151936 x 4096 x 4 bytes = 2489319424 bytes = 2374.0 MiB (the FAQ's 2,483,027,968 /
  // "about 2369 MB" is an arithmetic slip; the advice, 4096, is the same).
  EXPECT_NE(cause.find("2489319424 bytes"), std::string::npos) << cause;
  EXPECT_NE(cause.find("2374.0 MiB"), std::string::npos) << cause;
  EXPECT_NE(cause.find("2048 MiB bucket"), std::string::npos) << cause;
  EXPECT_NE(cause.find("gives 4096 MiB"), std::string::npos) << cause;
  EXPECT_EQ(x["title"],
            "model.embed_tokens.weight (2374.0 MiB) does not fit verl's 2048 MiB bucket");
  const std::string fix = fixes(x);
  EXPECT_EQ(x["fix"][0],
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096");
  EXPECT_NE(fix.find("ferry advise-bucket --shape 151936x4096 --dtype torch.float32"),
            std::string::npos);
}

TEST(Explain, BucketAdviceFollowsTheDtypeAndShape) {
  // 72B's [152064, 8192] float32 is 4752 MB: x1.2 -> 8192 MB, as the FAQ's table says.
  const Explained e = explain_json(
      "AssertionError: Weight lm_head.weight(torch.Size([152064, 8192]), torch.float32) is too "
      "large to "
      "fit in the bucket.Please increase rollout.update_weights_bucket_megabytes(4096 MB).");
  ASSERT_EQ(e.json.size(), 1u);
  EXPECT_EQ(e.json[0]["fix"][0],
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=8192");
  EXPECT_NE(e.json[0]["cause"].get<std::string>().find("4096 MiB bucket"), std::string::npos);
}

TEST(Explain, BucketMessageWithoutShapeStillGivesTheFullKey) {
  const Explained e = explain_json("AssertionError: Weight ... is too large to fit in the bucket");
  ASSERT_TRUE(explained_as(e, "verl.bucket_too_small"));
  const std::string fix = fixes(e.json[0]);
  EXPECT_NE(
      fix.find("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes="),
      std::string::npos);
  EXPECT_NE(fix.find("ferry advise-bucket"), std::string::npos);
  EXPECT_EQ(e.json[0]["cause"].get<std::string>().find('{'), std::string::npos);
}

// The README's example: no sizes in the text, so none in the title and no number guessed.
TEST(Explain, BucketMessageWithoutShapeHasNoUnfilledTitleOrGuessedSize) {
  const Explained e = explain_json("AssertionError: Weight ... is too large to fit in the bucket");
  ASSERT_EQ(e.json.size(), 1u) << e.out;
  const std::string title = e.json[0]["title"];
  EXPECT_EQ(title.find('{'), std::string::npos) << title;
  EXPECT_EQ(title.find("MiB"), std::string::npos) << title;
  const std::string fix = fixes(e.json[0]);
  EXPECT_EQ(fix.find("=4096"), std::string::npos) << fix;  // no shape, no number
  EXPECT_NE(fix.find("ferry advise-bucket --shape"), std::string::npos) << fix;
  EXPECT_NE(e.json[0]["cause"].get<std::string>().find("pass the whole error line"),
            std::string::npos);
  // The text form too: no brace reaches the terminal.
  const CommandResult r =
      run_ferry({"explain", "AssertionError: Weight ... is too large to fit in the bucket"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find('{'), std::string::npos) << r.out;
}

// A shape without the bucket size: computed from the shape, against verl's 2048 MiB default.
TEST(Explain, BucketMessageWithShapeButNoBucketSize) {
  const Explained e = explain_json(
      "AssertionError: Weight lm_head.weight(torch.Size([152064, 8192]), torch.bfloat16) is too "
      "large to fit in the bucket");
  ASSERT_EQ(e.json.size(), 1u) << e.out;
  // 152064 x 8192 x 2 bytes = 2376.0 MiB; x 1.2 = 2851 -> 4096.
  EXPECT_EQ(e.json[0]["title"], "lm_head.weight (2376.0 MiB) does not fit verl's 2048 MiB bucket");
  EXPECT_EQ(e.json[0]["fix"][0],
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096");
}

// Every built-in pattern, fed only the text its filter looks for (so no regex
// group or computed value is there): nothing printed may hold an unfilled
// {name} or the <name> marker of a value the pattern should have supplied.
TEST(Explain, NoPatternPrintsAnUnfilledPlaceholder) {
  auto text = read_file(std::string(FERRY_SOURCE_DIR) + "/data/device/explain_patterns.json");
  ASSERT_OK(text);
  const auto doc = nlohmann::json::parse(*text);
  const std::regex brace(R"(\{[a-z_]+\})");
  int explained = 0;
  for (const auto& p : doc["patterns"]) {
    std::vector<std::string> names = {"bytes",   "tensor_mib",    "advised_mib", "override",
                                      "shape_x", "element_bytes", "dir"};
    for (const auto& g : p.value("groups", nlohmann::json::array())) {
      names.push_back(g.get<std::string>());
    }
    for (const auto& c : p.value("contains", nlohmann::json::array())) {
      const std::string bare = c.get<std::string>();
      for (const std::string& line : {bare, "Error: " + bare + " ...", "Weight ... " + bare}) {
        auto found = device::explain(line, "");
        ASSERT_OK(found);
        for (const device::Explanation& x : *found) {
          ++explained;
          std::string all = x.title + "\n" + x.cause + "\n";
          for (const std::string& f : x.fix) all += f + "\n";
          EXPECT_FALSE(std::regex_search(all, brace)) << x.id << " on '" << line << "':\n" << all;
          for (const std::string& n : names) {
            EXPECT_EQ(all.find("<" + n + ">"), std::string::npos) << x.id << ": " << all;
          }
        }
      }
    }
  }
  EXPECT_GE(explained, static_cast<int>(doc["patterns"].size()) / 2);  // the loop did run
}

TEST(Explain, MissingCheckpointMetadataOnEachFile) {
  for (const std::string file : {"common.pt", ".metadata", "metadata.json"}) {
    const Explained e = explain_json(
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/data/ckpt/global_step_100/actor/" +
        file + "'");
    ASSERT_TRUE(explained_as(e, "ckpt.metadata_not_shared")) << file;
    const std::string fix = fixes(e.json[0]);
    EXPECT_NE(fix.find("ferry ckpt replicate /data/ckpt/global_step_100/actor"), std::string::npos)
        << fix;
    EXPECT_NE(fix.find("scp /data/ckpt/global_step_100/actor/common.pt"), std::string::npos) << fix;
  }
}

TEST(Explain, MissingMetadataAsTheFaqWritesIt) {
  const Explained e = explain_json("FileNotFoundError: common.pt");
  ASSERT_TRUE(explained_as(e, "ckpt.metadata_not_shared"));
}

TEST(Explain, ProfilerLevelType) {
  const Explained e =
      explain_json("AssertionError: Profiler level must be of type str, got <class 'int'>");
  ASSERT_TRUE(explained_as(e, "verl.profiler_level_type"));
  EXPECT_EQ(e.json[0]["fix"][0], "actor_rollout_ref.actor.profiler.tool_config.npu.level=level1");
}

TEST(Explain, ProfilerLevelValue) {
  const Explained e = explain_json(
      "AssertionError: Profiler level only supports level0, 1, 2, and level_none, but gets 1");
  ASSERT_TRUE(explained_as(e, "verl.profiler_level_value"));
  EXPECT_NE(e.json[0]["title"].get<std::string>().find("'1'"), std::string::npos);
  EXPECT_NE(fixes(e.json[0]).find("npu.level=level1"), std::string::npos);
}

TEST(Explain, HydraCommaListNeedsBrackets) {
  const Explained e = explain_json(
      "hydra.errors.ConfigCompositionException: Ambiguous value for argument "
      "'actor_rollout_ref.actor.profiler.tool_config.npu.contents=npu,cpu'");
  ASSERT_TRUE(explained_as(e, "hydra.comma_list"));
  EXPECT_EQ(e.json[0]["fix"][0],
            "'actor_rollout_ref.actor.profiler.tool_config.npu.contents=[npu,cpu]'");
}

TEST(Explain, SeveralErrorsInOneLog) {
  TempDir dir;
  write_bytes(dir.file("train.log"),
              "INFO step 1\n"
              "RuntimeError: torch_npu detected, but NPU device is not available or visible.\n"
              "noise\n"
              "AssertionError: Profiler level must be of type str, got <class 'int'>\n");
  const CommandResult r = run_ferry({"explain", "--file", dir.file("train.log")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[npu.not_visible]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[verl.profiler_level_type]"), std::string::npos) << r.out;
}

TEST(Explain, UnknownTextFails) {
  const CommandResult r = run_ferry({"explain", "everything is fine"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no known error"), std::string::npos);
}

TEST(Explain, NewPatternsComeFromTheDataFolder) {
  TempDir dir;
  write_bytes(
      dir.file("explain_patterns.json"),
      R"json({"patterns": [{"id": "x.custom", "contains": ["HCCL timeout"], "regex": "rank (\\d+)",
                 "groups": ["rank"], "cause": "rank {rank} stalled", "fix": ["export HCCL_CONNECT_TIMEOUT=1800"]}]})json");
  const CommandResult r =
      run_ferry({"explain", "--data-dir", dir.path(), "--json", "HCCL timeout on rank 7"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j[0]["cause"], "rank 7 stalled");
}

TEST(Explain, BrokenPatternFileNamesTheFile) {
  TempDir dir;
  write_bytes(dir.file("explain_patterns.json"), R"({"patterns": [{"id": "bad", "cause": "c"}]})");
  auto r = device::explain("x", dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("explain_patterns.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("bad"), std::string::npos);
}

TEST(Explain, VeryLongLinesAreSafe) {
  const std::string line(1 << 20, 'a');
  auto r = device::explain(
      line + "\nKeyError: decoder.layers.3.self_attention.k_layernorm.weight\n", "");
  ASSERT_OK(r);
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].id, "mindspeed.q_layernorm_keyerror");
}

}  // namespace
}  // namespace ferry::testing

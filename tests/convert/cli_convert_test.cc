// `ferry convert` end to end: both directions, --check, --json, exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/atomic_file.h"
#include "base/file_util.h"
#include "convert/convert_test_util.h"
#include "ferry/safetensors.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::convert {
namespace {

using ferry::testing::run_ferry;
using ferry::testing::TempDir;
using ::testing::HasSubstr;

void generate(const model::ModelConfig& c, const std::string& folder) {
  ASSERT_OK(model::generate_model_folder(c, folder, {}));
}

std::map<std::string, std::uint64_t> hashes(const std::string& folder) {
  std::map<std::string, std::uint64_t> out;
  auto f = ModelFolder::open(folder);
  EXPECT_OK(f);
  if (f.ok()) {
    for (const TensorView& v : f->views()) out[v.spec.name] = ferry::testing::hash_bytes(v.data);
  }
  return out;
}

TEST(CliConvert, RoundTripThroughTheCommand) {
  TempDir dir;
  generate(testing::tiny_config("qwen3"), dir.file("hf"));
  auto to = run_ferry({"convert", "--from", "hf", "--to", "megatron", "--tp", "2", "--json",
                       dir.file("hf"), dir.file("meg")});
  ASSERT_EQ(to.exit_code, 0) << to.err;
  auto doc = nlohmann::json::parse(to.out);
  EXPECT_EQ(doc["tp"], 2);
  EXPECT_EQ(doc["files"][1], "mp_rank_01/model.safetensors");
  auto back =
      run_ferry({"convert", "--from", "megatron", "--to", "hf", dir.file("meg"), dir.file("back")});
  ASSERT_EQ(back.exit_code, 0) << back.err;
  EXPECT_THAT(back.out, HasSubstr("wrote "));
  EXPECT_EQ(hashes(dir.file("back")), hashes(dir.file("hf")));
}

TEST(CliConvert, CheckListsWhatIsMissingWithoutWriting) {
  TempDir dir;
  model::ModelConfig llama = testing::tiny_config("llama");
  llama.head_dim = 8;
  generate(llama, dir.file("hf"));
  ASSERT_EQ(
      run_ferry({"convert", "--from", "hf", "--to", "megatron", dir.file("hf"), dir.file("meg")})
          .exit_code,
      0);
  auto ok = run_ferry({"convert", "--from", "megatron", "--to", "hf", "--check", dir.file("meg")});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("all names and shapes match"));

  ASSERT_OK(write_file_atomic(dir.file("meg/config.json"),
                              model::hf_config_json(testing::tiny_config("qwen3"), DType::kBF16)));
  auto bad = run_ferry({"convert", "--from", "megatron", "--to", "hf", "--check", dir.file("meg")});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.out,
              HasSubstr("2 layers lack decoder.layers.N.self_attention.q_layernorm.weight"));
  EXPECT_THAT(bad.out, HasSubstr("MindSpeed"));
  auto json = run_ferry(
      {"convert", "--from", "megatron", "--to", "hf", "--check", "--json", dir.file("meg")});
  EXPECT_EQ(json.exit_code, 1);
  auto doc = nlohmann::json::parse(json.out);
  EXPECT_FALSE(doc["ok"].get<bool>());
  EXPECT_EQ(doc["reports"][0]["missing"][0]["pattern"],
            "decoder.layers.N.self_attention.q_layernorm.weight");
  EXPECT_EQ(doc["reports"][0]["missing"][0]["layers"], nlohmann::json::array({0, 1}));
  // The conversion itself fails with the same report and writes nothing.
  auto convert =
      run_ferry({"convert", "--from", "megatron", "--to", "hf", dir.file("meg"), dir.file("back")});
  EXPECT_EQ(convert.exit_code, 1);
  EXPECT_THAT(convert.err, HasSubstr("k_layernorm"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("back")));
}

TEST(CliConvert, UsageErrorsExitTwo) {
  TempDir dir;
  EXPECT_EQ(
      run_ferry({"convert", "--from", "hf", "--to", "hf", dir.path(), dir.file("x")}).exit_code, 2);
  auto tp = run_ferry(
      {"convert", "--from", "megatron", "--to", "hf", "--tp", "2", dir.path(), dir.file("x")});
  EXPECT_EQ(tp.exit_code, 2);
  EXPECT_THAT(tp.err, HasSubstr("--tp"));
  EXPECT_EQ(run_ferry({"convert", "--from", "hf", "--to", "megatron", dir.path()}).exit_code, 2);
  auto help = run_ferry({"convert", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("ferry convert --from hf --to megatron --tp 2"));
}

TEST(CliConvert, TpThatDoesNotDivideFailsWithTheField) {
  TempDir dir;
  generate(testing::tiny_config("llama"), dir.file("hf"));
  auto r = run_ferry({"convert", "--from", "hf", "--to", "megatron", "--tp", "8", dir.file("hf"),
                      dir.file("meg")});
  // Found in the model's config.json, not in the command line: a failure (1), not usage (2).
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("num_key_value_heads = 4"));
}

}  // namespace
}  // namespace ferry::convert

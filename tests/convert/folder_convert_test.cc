// Whole folders: HF -> Megatron (tp 1, 2, 4) -> HF is bit-exact for every family.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "base/atomic_file.h"
#include "base/file_util.h"
#include "convert/convert_test_util.h"
#include "ferry/safetensors.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::convert {
namespace {

using ferry::testing::hash_bytes;
using ferry::testing::TempDir;
using ::testing::HasSubstr;

void generate(const model::ModelConfig& c, const std::string& folder, std::uint64_t shard = 5e9) {
  model::GenerateOptions o;
  o.dtype = DType::kBF16;
  o.seed = 3;
  o.max_shard_bytes = shard;
  ASSERT_OK(model::generate_model_folder(c, folder, o));
}

// name -> hash of every tensor in a model folder.
std::map<std::string, std::uint64_t> hashes(const std::string& folder) {
  std::map<std::string, std::uint64_t> out;
  auto f = ModelFolder::open(folder);
  EXPECT_OK(f);
  if (!f.ok()) return out;
  for (const TensorView& v : f->views()) out[v.spec.name] = hash_bytes(v.data);
  return out;
}

struct Case {
  const char* family;
  bool tied;
  int tp;
};

class RoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTrip, HfToMegatronToHfIsBitExact) {
  const Case c = GetParam();
  TempDir dir;
  const std::string hf = dir.file("hf"), meg = dir.file("meg"), back = dir.file("back");
  // Several HF shards on the way in, to read a sharded index.
  generate(testing::tiny_config(c.family, c.tied), hf, 20000);
  ConvertOptions o;
  o.layout.tp = c.tp;
  std::uint64_t last_done = 0, last_total = 0;
  o.progress = [&](std::uint64_t d, std::uint64_t t) { last_done = d, last_total = t; };
  auto to_meg = hf_to_megatron(hf, meg, o);
  ASSERT_OK(to_meg);
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(to_meg->files.size(), static_cast<std::size_t>(c.tp));
  EXPECT_TRUE(std::filesystem::exists(meg + "/mp_rank_0" + std::to_string(c.tp - 1) +
                                      "/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(meg + "/config.json"));
  auto info = read_megatron_layout(meg);
  ASSERT_OK(info);
  EXPECT_EQ(info->layout.tp, c.tp);
  EXPECT_EQ(info->dtype, DType::kBF16);

  auto to_hf = megatron_to_hf(meg, back, {});
  ASSERT_OK(to_hf);
  EXPECT_EQ(hashes(back), hashes(hf));
  EXPECT_TRUE(std::filesystem::exists(back + "/config.json"));
}

INSTANTIATE_TEST_SUITE_P(Families, RoundTrip,
                         ::testing::Values(Case{"llama", false, 1}, Case{"llama", false, 2},
                                           Case{"llama", true, 4}, Case{"qwen2", true, 1},
                                           Case{"qwen2", false, 2}, Case{"qwen2", false, 4},
                                           Case{"qwen3", false, 1}, Case{"qwen3", true, 2},
                                           Case{"qwen3", false, 4}),
                         [](const auto& test_info) {
                           return std::string(test_info.param.family) +
                                  (test_info.param.tied ? "_tied" : "") + "_tp" +
                                  std::to_string(test_info.param.tp);
                         });

// The files on disk hold what the in-memory layout says (rank 1's own KV groups, [gate_1; up_1]).
TEST(FolderConvert, RankFilesHoldTheDocumentedLayout) {
  TempDir dir;
  const model::ModelConfig c = testing::tiny_config("qwen2");
  generate(c, dir.file("hf"));
  ConvertOptions o;
  o.layout = {.tp = 2, .norms = NormLayout::kSeparate, .padded_vocab_size = 128};
  ASSERT_OK(hf_to_megatron(dir.file("hf"), dir.file("meg"), o));
  auto m = build_mapping(c, o.layout, DType::kBF16);
  ASSERT_OK(m);
  auto hf = ModelFolder::open(dir.file("hf"));
  ASSERT_OK(hf);
  std::map<std::string, testing::Bytes> hf_bytes;
  for (const TensorView& v : hf->views())
    hf_bytes[v.spec.name].assign(v.data.begin(), v.data.end());
  auto rank1 = SafetensorsFile::open(dir.file("meg/mp_rank_01/model.safetensors"));
  ASSERT_OK(rank1);
  for (const MegatronParam& p : m->params) {
    auto v = rank1->view(p.name);
    ASSERT_OK(v) << p.name;
    EXPECT_EQ(v->spec.shape, p.shard_shape) << p.name;
    EXPECT_EQ(hash_bytes(v->data), hash_bytes(testing::build_shard(*m, p, 1, hf_bytes))) << p.name;
  }
  auto back = megatron_to_hf(dir.file("meg"), dir.file("back"), {});
  ASSERT_OK(back);
  EXPECT_EQ(hashes(dir.file("back")), hashes(dir.file("hf")));
}

TEST(FolderConvert, OutputShardsFollowMaxShardBytes) {
  TempDir dir;
  generate(testing::tiny_config("llama"), dir.file("hf"));
  ASSERT_OK(hf_to_megatron(dir.file("hf"), dir.file("meg"), {}));
  ConvertOptions o;
  o.max_shard_bytes = 30000;
  auto r = megatron_to_hf(dir.file("meg"), dir.file("back"), o);
  ASSERT_OK(r);
  EXPECT_GT(r->files.size(), 1u);
  EXPECT_TRUE(std::filesystem::exists(dir.file("back/model.safetensors.index.json")));
  EXPECT_EQ(hashes(dir.file("back")), hashes(dir.file("hf")));
}

// A Megatron folder without q/k layernorm read as Qwen3: every problem at once, and nothing
// written.
TEST(FolderConvert, MissingQkLayernormIsReportedNotKeyError) {
  TempDir dir;
  model::ModelConfig llama = testing::tiny_config("llama");
  llama.head_dim = 8;
  generate(llama, dir.file("hf"));
  ASSERT_OK(hf_to_megatron(dir.file("hf"), dir.file("meg"), {.layout = {.tp = 2}}));
  model::ModelConfig qwen3 = testing::tiny_config("qwen3");
  ASSERT_OK(
      write_file_atomic(dir.file("meg/config.json"), model::hf_config_json(qwen3, DType::kBF16)));
  auto r = megatron_to_hf(dir.file("meg"), dir.file("back"), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  const std::string& msg = r.status().message();
  EXPECT_THAT(msg, HasSubstr("mp_rank_00/model.safetensors (and 1 more ranks)"));
  EXPECT_THAT(msg, HasSubstr("2 layers lack decoder.layers.N.self_attention.q_layernorm.weight"));
  EXPECT_THAT(msg, HasSubstr("2 layers lack decoder.layers.N.self_attention.k_layernorm.weight"));
  EXPECT_THAT(msg, HasSubstr("2.3.0_core_r0.12.1"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("back")));

  auto check = check_megatron_folder(dir.file("meg"));
  ASSERT_OK(check);
  ASSERT_EQ(check->size(), 2u);
  EXPECT_FALSE((*check)[1].ok());
}

TEST(FolderConvert, HfSideProblemsStopBeforeWriting) {
  TempDir dir;
  generate(testing::tiny_config("llama"), dir.file("hf"));
  // config.json claims Qwen2 (biases) for a Llama checkpoint.
  ASSERT_OK(write_file_atomic(dir.file("hf/config.json"),
                              model::hf_config_json(testing::tiny_config("qwen2"), DType::kBF16)));
  auto r = hf_to_megatron(dir.file("hf"), dir.file("meg"), {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("2 layers lack model.layers.N.self_attn.q_proj.bias"));
  EXPECT_THAT(r.status().message(),
              HasSubstr("2 layers lack model.layers.N.self_attn.v_proj.bias"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("meg")));
  auto check = check_hf_folder(dir.file("hf"), {});
  ASSERT_OK(check);
  EXPECT_EQ((*check)[0].missing.size(), 3u);
}

TEST(FolderConvert, FolderErrorsNameTheFile) {
  TempDir dir;
  generate(testing::tiny_config("llama"), dir.file("hf"));
  // Not a ferry Megatron folder.
  auto r = megatron_to_hf(dir.file("hf"), dir.file("back"), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("ferry_megatron.json"));
  // No config.json.
  std::filesystem::remove(dir.file("hf/config.json"));
  auto no_config = hf_to_megatron(dir.file("hf"), dir.file("meg"), {});
  ASSERT_FALSE(no_config.ok());
  EXPECT_THAT(no_config.status().message(), HasSubstr("config.json"));
}

TEST(FolderConvert, RefusesANonEmptyDestination) {
  TempDir dir;
  generate(testing::tiny_config("llama"), dir.file("hf"));
  ASSERT_TRUE(write_file_atomic(dir.file("meg/keep.txt"), "x").ok() ||
              (std::filesystem::create_directories(dir.file("meg")),
               write_file_atomic(dir.file("meg/keep.txt"), "x").ok()));
  auto r = hf_to_megatron(dir.file("hf"), dir.file("meg"), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kAlreadyExists);
  ConvertOptions o;
  o.overwrite = true;
  EXPECT_OK(hf_to_megatron(dir.file("hf"), dir.file("meg"), o));
}

TEST(FolderConvert, LayoutFileIsValidated) {
  TempDir dir;
  generate(testing::tiny_config("llama"), dir.file("hf"));
  ASSERT_OK(hf_to_megatron(dir.file("hf"), dir.file("meg"), {}));
  ASSERT_OK(write_file_atomic(dir.file("meg/ferry_megatron.json"),
                              R"({"format": "ferry-megatron", "version": 1, "tp": 0})"));
  auto info = read_megatron_layout(dir.file("meg"));
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr("'tp'"));
}

}  // namespace
}  // namespace ferry::convert

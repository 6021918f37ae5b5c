// Every name/shape problem is reported at once, grouped, with its likely cause.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "convert/convert_test_util.h"
#include "support/status_matchers.h"

namespace ferry::convert {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<TensorSpec> without(std::vector<TensorSpec> specs, std::string_view part) {
  specs.erase(
      std::remove_if(specs.begin(), specs.end(),
                     [&](const TensorSpec& t) { return t.name.find(part) != std::string::npos; }),
      specs.end());
  return specs;
}

Mapping mapping_for(model::ModelConfig c, MegatronLayout layout = {}) {
  auto m = build_mapping(c, layout, DType::kBF16);
  EXPECT_OK(m);
  return std::move(*m);
}

TEST(NameCheck, MatchingTensorsAreOk) {
  const Mapping m = mapping_for(testing::tiny_config("qwen3"), {.tp = 2});
  EXPECT_TRUE(check_tensors(m, Side::kHf, m.hf_tensors).ok());
  const CheckReport r = check_tensors(m, Side::kMegatron, m.shard_specs());
  EXPECT_TRUE(r.ok());
  EXPECT_OK(r.to_status());
}

// The FAQ's KeyError, on a 24-layer Qwen3: one line for all 24 layers, and the MindSpeed cause.
TEST(NameCheck, MissingQkLayernormIsOneLinePerNameWithMindSpeedCause) {
  model::ModelConfig c = testing::tiny_config("qwen3");
  c.num_layers = 24;
  const Mapping m = mapping_for(c);
  const auto found = without(without(m.shard_specs(), "q_layernorm"), "k_layernorm");
  const CheckReport r = check_tensors(m, Side::kMegatron, found, "ckpt/mp_rank_00");
  ASSERT_EQ(r.missing.size(), 2u);
  EXPECT_EQ(r.missing[0].pattern, "decoder.layers.N.self_attention.q_layernorm.weight");
  EXPECT_EQ(r.missing[0].layers.size(), 24u);
  const std::string text = r.to_string();
  EXPECT_THAT(text, HasSubstr("24 layers lack decoder.layers.N.self_attention.q_layernorm.weight "
                              "(layers 0-23)"));
  EXPECT_THAT(text, HasSubstr("24 layers lack decoder.layers.N.self_attention.k_layernorm.weight"));
  EXPECT_THAT(text, HasSubstr("MindSpeed"));
  EXPECT_THAT(text, HasSubstr("2.3.0_core_r0.12.1"));
  EXPECT_THAT(text, HasSubstr("not a Qwen3 model"));
  EXPECT_THAT(text, HasSubstr("ckpt/mp_rank_00"));
  EXPECT_EQ(r.to_status().code(), Code::kNotFound);
}

TEST(NameCheck, QkNormsUnderALlamaConfigPointToQwen3) {
  const Mapping qwen3 = mapping_for(testing::tiny_config("qwen3"));
  model::ModelConfig c = testing::tiny_config("llama");
  c.head_dim = 8;  // same shapes as the Qwen3 tiny model, other family
  const Mapping llama = mapping_for(c);
  const CheckReport r = check_tensors(llama, Side::kHf, qwen3.hf_tensors);
  ASSERT_EQ(r.unexpected.size(), 2u);
  EXPECT_THAT(r.to_string(),
              HasSubstr("2 layers have unexpected model.layers.N.self_attn.q_norm.weight"));
  EXPECT_THAT(r.to_string(), HasSubstr("likely a Qwen3 model"));
  EXPECT_EQ(r.to_status().code(), Code::kFailedPrecondition);
}

TEST(NameCheck, MissingBiasPointsAwayFromQwen2) {
  const Mapping m = mapping_for(testing::tiny_config("qwen2"));
  const CheckReport r = check_tensors(m, Side::kMegatron, without(m.shard_specs(), ".bias"));
  ASSERT_EQ(r.missing.size(), 1u);
  EXPECT_THAT(r.to_string(),
              HasSubstr("2 layers lack decoder.layers.N.self_attention.linear_qkv.bias"));
  EXPECT_THAT(r.to_string(), HasSubstr("q/k/v projections have biases"));
}

TEST(NameCheck, TiedMismatchNamesTieWordEmbeddings) {
  const Mapping untied = mapping_for(testing::tiny_config("llama"));
  const Mapping tied = mapping_for(testing::tiny_config("llama", true));
  const CheckReport missing_head = check_tensors(untied, Side::kHf, tied.hf_tensors);
  EXPECT_THAT(missing_head.to_string(), HasSubstr("missing: lm_head.weight"));
  EXPECT_THAT(missing_head.to_string(), HasSubstr("tie_word_embeddings = false"));
  const CheckReport extra_head = check_tensors(tied, Side::kMegatron, untied.shard_specs());
  EXPECT_THAT(extra_head.to_string(), HasSubstr("unexpected: output_layer.weight"));
  EXPECT_THAT(extra_head.to_string(), HasSubstr("tie_word_embeddings = true"));
}

TEST(NameCheck, LocalSpecNormsSuggestSeparateLayout) {
  const Mapping fused = mapping_for(testing::tiny_config("llama"));
  const Mapping local =
      mapping_for(testing::tiny_config("llama"), {.norms = NormLayout::kSeparate});
  const CheckReport r = check_tensors(fused, Side::kMegatron, local.shard_specs());
  EXPECT_EQ(r.missing.size(), 2u);
  EXPECT_EQ(r.unexpected.size(), 2u);
  EXPECT_THAT(r.to_string(), HasSubstr("--norms separate"));
}

TEST(NameCheck, HfNamesOnTheMegatronSideSayFromHf) {
  const Mapping m = mapping_for(testing::tiny_config("llama"));
  const CheckReport r = check_tensors(m, Side::kMegatron, m.hf_tensors);
  EXPECT_THAT(r.to_string(), HasSubstr("--from hf"));
  const CheckReport back = check_tensors(m, Side::kHf, m.shard_specs());
  EXPECT_THAT(back.to_string(), HasSubstr("--from megatron"));
}

TEST(NameCheck, LayerCountMismatchBothWays) {
  model::ModelConfig c = testing::tiny_config("llama");
  const Mapping two = mapping_for(c);
  c.num_layers = 4;
  const Mapping four = mapping_for(c);
  const CheckReport fewer = check_tensors(four, Side::kHf, two.hf_tensors);
  EXPECT_THAT(fewer.to_string(), HasSubstr("stops at layer 1"));
  EXPECT_THAT(fewer.to_string(), HasSubstr("layers 2-3"));
  const CheckReport more = check_tensors(two, Side::kHf, four.hf_tensors);
  EXPECT_THAT(more.to_string(), HasSubstr("layers up to 3"));
  EXPECT_THAT(more.to_string(), HasSubstr("num_hidden_layers = 2"));
}

TEST(NameCheck, ShapesAndDtypesAreCheckedAgainstConfig) {
  const Mapping m = mapping_for(testing::tiny_config("llama"), {.tp = 2});
  std::vector<TensorSpec> found = m.shard_specs();
  for (TensorSpec& t : found) {
    if (t.name == "decoder.layers.0.self_attention.linear_qkv.weight") t.shape = {64, 32};
    if (t.name == "decoder.final_layernorm.weight") t.dtype = DType::kF32;
  }
  const CheckReport r = check_tensors(m, Side::kMegatron, found);
  ASSERT_EQ(r.bad_tensors.size(), 2u);
  EXPECT_TRUE(r.missing.empty());
  EXPECT_THAT(r.to_string(), HasSubstr("linear_qkv.weight: shape [64, 32] in the file, [32, 32] "
                                       "from config.json at tp = 2"));
  EXPECT_THAT(r.to_string(), HasSubstr("final_layernorm.weight: dtype F32"));
  EXPECT_THAT(r.to_string(), Not(HasSubstr("likely cause")));
}

TEST(NameCheck, ScatteredLayersAreListedAsRanges) {
  model::ModelConfig c = testing::tiny_config("llama");
  c.num_layers = 8;
  const Mapping m = mapping_for(c);
  std::vector<TensorSpec> found;
  for (const TensorSpec& t : m.hf_tensors) {
    const bool drop =
        t.name.ends_with("mlp.up_proj.weight") &&
        (t.name.find(".0.") != std::string::npos || t.name.find(".3.") != std::string::npos ||
         t.name.find(".4.") != std::string::npos || t.name.find(".5.") != std::string::npos);
    if (!drop) found.push_back(t);
  }
  const CheckReport r = check_tensors(m, Side::kHf, found);
  EXPECT_THAT(r.to_string(),
              HasSubstr("4 layers lack model.layers.N.mlp.up_proj.weight (layers 0, 3-5)"));
}

}  // namespace
}  // namespace ferry::convert

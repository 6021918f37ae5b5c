// Names and shapes of the mapping per family, and the config checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "convert/convert_test_util.h"
#include "support/status_matchers.h"

namespace ferry::convert {
namespace {

using ::testing::HasSubstr;

std::set<std::string> names(const Mapping& m) {
  std::set<std::string> out;
  for (const MegatronParam& p : m.params) out.insert(p.name);
  return out;
}

TEST(Mapping, Qwen3HasQkLayernormAndNoBias) {
  auto m = build_mapping(testing::tiny_config("qwen3"), {}, DType::kBF16);
  ASSERT_OK(m);
  const auto n = names(*m);
  EXPECT_TRUE(n.contains("decoder.layers.1.self_attention.q_layernorm.weight"));
  EXPECT_TRUE(n.contains("decoder.layers.1.self_attention.k_layernorm.weight"));
  EXPECT_FALSE(n.contains("decoder.layers.0.self_attention.linear_qkv.bias"));
  const MegatronParam* q = m->find_param("decoder.layers.0.self_attention.q_layernorm.weight");
  EXPECT_EQ(q->hf_names, (std::vector<std::string>{"model.layers.0.self_attn.q_norm.weight"}));
  EXPECT_EQ(q->shape, (std::vector<std::int64_t>{8}));
  // head_dim 8 with 8 heads: q is 64 wide while hidden is 32.
  EXPECT_EQ(m->find_param("decoder.layers.0.self_attention.linear_qkv.weight")->shape,
            (std::vector<std::int64_t>{64 + 2 * 32, 32}));
  EXPECT_EQ(m->find_param("decoder.layers.0.self_attention.linear_proj.weight")->shape,
            (std::vector<std::int64_t>{32, 64}));
}

TEST(Mapping, Qwen2HasQkvBiasLlamaHasNeither) {
  auto q2 = build_mapping(testing::tiny_config("qwen2"), {}, DType::kBF16);
  ASSERT_OK(q2);
  EXPECT_NE(q2->find_param("decoder.layers.0.self_attention.linear_qkv.bias"), nullptr);
  auto ll = build_mapping(testing::tiny_config("llama"), {}, DType::kBF16);
  ASSERT_OK(ll);
  EXPECT_EQ(ll->find_param("decoder.layers.0.self_attention.linear_qkv.bias"), nullptr);
  EXPECT_EQ(ll->find_param("decoder.layers.0.self_attention.q_layernorm.weight"), nullptr);
}

TEST(Mapping, FusedNormsByDefaultSeparateOnRequest) {
  auto fused = build_mapping(testing::tiny_config("llama"), {}, DType::kBF16);
  ASSERT_OK(fused);
  EXPECT_EQ(fused->find_param("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight")
                ->hf_names[0],
            "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(fused->find_param("decoder.layers.0.mlp.linear_fc1.layer_norm_weight")->hf_names[0],
            "model.layers.0.post_attention_layernorm.weight");
  auto sep =
      build_mapping(testing::tiny_config("llama"), {.norms = NormLayout::kSeparate}, DType::kBF16);
  ASSERT_OK(sep);
  EXPECT_NE(sep->find_param("decoder.layers.0.input_layernorm.weight"), nullptr);
  EXPECT_NE(sep->find_param("decoder.layers.0.pre_mlp_layernorm.weight"), nullptr);
  EXPECT_EQ(sep->find_param("decoder.layers.0.mlp.linear_fc1.layer_norm_weight"), nullptr);
}

TEST(Mapping, TiedModelHasNoOutputLayer) {
  auto tied = build_mapping(testing::tiny_config("qwen2", /*tied=*/true), {}, DType::kBF16);
  ASSERT_OK(tied);
  EXPECT_EQ(tied->find_param("output_layer.weight"), nullptr);
  EXPECT_EQ(tied->find_hf("lm_head.weight"), -1);
  auto untied = build_mapping(testing::tiny_config("qwen2"), {}, DType::kBF16);
  ASSERT_OK(untied);
  EXPECT_EQ(untied->find_param("output_layer.weight")->hf_names[0], "lm_head.weight");
}

TEST(Mapping, EveryHfTensorHasExactlyOneHome) {
  for (const char* family : {"llama", "qwen2", "qwen3"}) {
    auto m = build_mapping(testing::tiny_config(family), {.tp = 2}, DType::kBF16);
    ASSERT_OK(m);
    std::multiset<std::string> homes;
    for (const MegatronParam& p : m->params) homes.insert(p.hf_names.begin(), p.hf_names.end());
    ASSERT_EQ(homes.size(), m->hf_tensors.size()) << family;
    for (const TensorSpec& t : m->hf_tensors) EXPECT_EQ(homes.count(t.name), 1u) << t.name;
  }
}

TEST(Mapping, TpMustDivideKvHeads) {
  auto m = build_mapping(testing::tiny_config("llama"), {.tp = 8}, DType::kBF16);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("num_key_value_heads = 4"));
  EXPECT_THAT(m.status().message(), HasSubstr("tensor-parallel size 8"));
}

TEST(Mapping, RejectsUnknownFamilyAndBadVocabPadding) {
  model::ModelConfig c = testing::tiny_config("llama");
  c.family = "mixtral";
  auto m = build_mapping(c, {}, DType::kBF16);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("mixtral"));
  auto p = build_mapping(testing::tiny_config("llama"), {.padded_vocab_size = 50}, DType::kBF16);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("below vocab_size 100"));
  auto odd = build_mapping(testing::tiny_config("llama"), {.tp = 2, .padded_vocab_size = 101},
                           DType::kBF16);
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(odd.status().message(), HasSubstr("padded vocab size = 101"));
}

TEST(Mapping, ParsesNormLayoutNames) {
  EXPECT_EQ(*parse_norm_layout("fused"), NormLayout::kFused);
  EXPECT_EQ(*parse_norm_layout("local"), NormLayout::kSeparate);
  auto bad = parse_norm_layout("apex");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'fused'"));
}

}  // namespace
}  // namespace ferry::convert

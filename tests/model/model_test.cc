#include "ferry/model.h"

#include <gtest/gtest.h>

#include "base/file_util.h"
#include "ferry/safetensors.h"
#include "support/status_matchers.h"
#include "support/test_support.h"

namespace ferry::model {
namespace {

// The FAQ's table of recommended buckets (fp32 embeddings, margin 1.2).
struct FaqRow {
  std::int64_t rows, cols;
  std::uint64_t bucket_mb;
};

class FaqBucketTable : public ::testing::TestWithParam<FaqRow> {};

TEST_P(FaqBucketTable, ReproducesRecommendation) {
  const FaqRow row = GetParam();
  auto spec = TensorSpec::make("model.embed_tokens.weight", DType::kF32, {row.rows, row.cols});
  ASSERT_OK(spec);
  auto advice = advise_bucket(spec->bytes());
  ASSERT_OK(advice);
  EXPECT_EQ(advice->bucket_mb, row.bucket_mb);
  EXPECT_EQ(advice->override_line,
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=" +
                std::to_string(row.bucket_mb));
}

INSTANTIATE_TEST_SUITE_P(Faq, FaqBucketTable,
                         ::testing::Values(FaqRow{151936, 4096, 4096}, FaqRow{152064, 5120, 4096},
                                           FaqRow{152064, 8192, 8192}));

TEST(AdviseBucket, RoundsUpToPowerOfTwoWithMargin) {
  EXPECT_EQ(advise_bucket(100ULL << 20)->bucket_mb, 128u);  // 120 MB -> 128
  EXPECT_EQ(advise_bucket(110ULL << 20)->bucket_mb, 256u);  // 132 MB -> 256
  EXPECT_EQ(advise_bucket(100ULL << 20, 1.5)->bucket_mb, 256u);
  EXPECT_EQ(advise_bucket(1ULL << 20, 1.0)->bucket_mb, 1u);
  EXPECT_FALSE(advise_bucket(1, 0.5).ok());
}

TEST(Presets, HaveTheRealShapes) {
  auto q7 = preset("qwen2.5-7b");
  ASSERT_OK(q7);
  EXPECT_EQ(q7->vocab_size, 152064);
  EXPECT_EQ(q7->hidden_size, 3584);
  EXPECT_EQ(q7->num_kv_heads, 4);
  EXPECT_EQ(q7->head_dim, 128);
  EXPECT_TRUE(q7->qkv_bias);
  EXPECT_FALSE(q7->tie_word_embeddings);
  auto q3 = preset("Qwen/Qwen3-8B");
  ASSERT_OK(q3);
  EXPECT_TRUE(q3->qk_norm);
  EXPECT_EQ(q3->vocab_size, 151936);
  EXPECT_EQ(q3->hidden_size, 4096);
  auto llama = preset("meta-llama-3-8b");
  ASSERT_OK(llama);
  EXPECT_EQ(llama->vocab_size, 128256);
  EXPECT_FALSE(preset("gpt2").ok());
}

TEST(HfTensorSpecs, ListsEveryTensorOfTheFamily) {
  auto q = preset("qwen2.5-0.5b");
  ASSERT_OK(q);
  auto specs = hf_tensor_specs(*q, DType::kBF16);
  // 24 layers x 12 tensors (q,k,v weight+bias, o, gate, up, down, 2 norms) + embed + norm; tied.
  EXPECT_EQ(specs.size(), 24u * 12 + 2);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.front().bytes(), 151936ULL * 896 * 2);  // the FAQ's 272 MB embedding
  auto q3 = preset("qwen3-0.6b");
  auto q3specs = hf_tensor_specs(*q3, DType::kBF16);
  bool has_qnorm = false;
  for (const auto& s : q3specs) has_qnorm |= s.name == "model.layers.0.self_attn.q_norm.weight";
  EXPECT_TRUE(has_qnorm);
  EXPECT_EQ(q3specs[1].shape, (std::vector<std::int64_t>{16 * 128, 1024}));  // q_proj
}

TEST(HfConfig, RoundTripsAndNamesBadFields) {
  auto q = preset("qwen3-8b");
  auto parsed = parse_hf_config(hf_config_json(*q, DType::kBF16), "config.json");
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->head_dim, 128);
  EXPECT_EQ(parsed->num_kv_heads, 8);
  EXPECT_TRUE(parsed->qk_norm);
  auto bad = parse_hf_config(R"({"model_type":"qwen2","hidden_size":-3})", "cfg.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cfg.json"), std::string::npos);
  EXPECT_FALSE(parse_hf_config(R"({"model_type":"gpt2"})", "c").ok());
}

TEST(Synthetic, BytesDoNotDependOnPieceBoundaries) {
  std::vector<std::byte> whole(1000), pieces(1000);
  fill_synthetic(7, "w", 3, whole);
  std::size_t at = 0;
  for (std::size_t n : {1, 2, 5, 8, 13, 971}) {
    fill_synthetic(7, "w", 3 + at, std::span(pieces).subspan(at, n));
    at += n;
  }
  EXPECT_EQ(whole, pieces);
  std::vector<std::byte> other(1000);
  fill_synthetic(8, "w", 3, other);
  EXPECT_NE(whole, other);
}

TEST(Generate, WritesShardedFolderWhoseBytesMatchTheGenerator) {
  testing::TempDir dir;
  auto q = preset("qwen2.5-0.5b");
  q->num_layers = 2;
  GenerateOptions o;
  o.dtype = DType::kF16;
  o.seed = 3;
  o.max_shard_bytes = 100'000'000;  // forces several shards
  ASSERT_OK(generate_model_folder(*q, dir.path(), o));
  auto folder = ModelFolder::open(dir.path());
  ASSERT_OK(folder);
  EXPECT_GT(folder->index().files.size(), 1u);
  EXPECT_EQ(folder->index().tensors.size(), hf_tensor_specs(*q, DType::kF16).size());
  for (const TensorView& v : folder->views()) {
    std::vector<std::byte> expected(v.data.size());
    fill_synthetic(3, v.spec.name, 0, expected);
    ASSERT_TRUE(std::equal(v.data.begin(), v.data.end(), expected.begin())) << v.spec.name;
  }
  auto config = read_file(dir.file("config.json"));
  ASSERT_OK(config);
  auto parsed = parse_hf_config(*config, "config.json");
  ASSERT_OK(parsed);
  EXPECT_EQ(parsed->num_layers, 2);
}

}  // namespace
}  // namespace ferry::model

// The fused layouts checked element by element against small hand-computed examples.
#include <gtest/gtest.h>

#include <cstring>

#include "convert/convert_test_util.h"
#include "support/status_matchers.h"

namespace ferry::convert {
namespace {

using testing::Bytes;

// 4 query heads in 2 KV groups, head_dim 2, hidden 2: q_proj has 8 rows, k/v_proj 4 rows.
model::ModelConfig hand_config() {
  model::ModelConfig c = testing::tiny_config("qwen2");
  c.vocab_size = 6;
  c.hidden_size = 2;
  c.num_layers = 1;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 2;
  c.intermediate_size = 4;
  return c;
}

// Element (row, col) of tensor `tag` is tag * 100 + row * 10 + col, as F32.
Bytes tagged(int tag, int rows, int cols) {
  Bytes b(static_cast<std::size_t>(rows * cols) * 4);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const float v = static_cast<float>(tag * 100 + r * 10 + c);
      std::memcpy(b.data() + static_cast<std::size_t>(r * cols + c) * 4, &v, 4);
    }
  }
  return b;
}

std::vector<float> floats(const Bytes& b) {
  std::vector<float> out(b.size() / 4);
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

// Rows of `tag`: the values of column 0 (tag * 100 + row * 10).
std::vector<float> rows(int tag, std::initializer_list<int> r) {
  std::vector<float> out;
  for (int i : r) out.push_back(static_cast<float>(tag * 100 + i * 10));
  return out;
}

std::vector<float> column0(const std::vector<float>& v, int cols) {
  std::vector<float> out;
  for (std::size_t i = 0; i < v.size(); i += static_cast<std::size_t>(cols)) out.push_back(v[i]);
  return out;
}

std::map<std::string, Bytes> hand_hf() {
  const std::string p = "model.layers.0.";
  return {
      {"model.embed_tokens.weight", tagged(9, 6, 2)},
      {p + "self_attn.q_proj.weight", tagged(1, 8, 2)},
      {p + "self_attn.k_proj.weight", tagged(2, 4, 2)},
      {p + "self_attn.v_proj.weight", tagged(3, 4, 2)},
      {p + "self_attn.q_proj.bias", tagged(1, 8, 1)},
      {p + "self_attn.k_proj.bias", tagged(2, 4, 1)},
      {p + "self_attn.v_proj.bias", tagged(3, 4, 1)},
      {p + "self_attn.o_proj.weight", tagged(4, 2, 8)},
      {p + "mlp.gate_proj.weight", tagged(5, 4, 2)},
      {p + "mlp.up_proj.weight", tagged(6, 4, 2)},
      {p + "mlp.down_proj.weight", tagged(7, 2, 4)},
      {p + "input_layernorm.weight", tagged(8, 2, 1)},
      {p + "post_attention_layernorm.weight", tagged(8, 2, 1)},
      {"model.norm.weight", tagged(8, 2, 1)},
      {"lm_head.weight", tagged(10, 6, 2)},
  };
}

Bytes shard_of(const Mapping& m, const std::string& name, int rank) {
  const MegatronParam* p = m.find_param(name);
  EXPECT_NE(p, nullptr) << name;
  return testing::build_shard(m, *p, rank, hand_hf());
}

TEST(GqaLayout, WholeQkvIsGroupedQHeadsThenKThenV) {
  auto m = build_mapping(hand_config(), MegatronLayout{}, DType::kF32);
  ASSERT_OK(m);
  const MegatronParam* p = m->find_param("decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->shape, (std::vector<std::int64_t>{16, 2}));
  // Group 0: q heads 0-1 (q rows 0-3), k head 0 (k rows 0-1), v head 0; then group 1.
  std::vector<float> want;
  for (auto part : {rows(1, {0, 1, 2, 3}), rows(2, {0, 1}), rows(3, {0, 1}), rows(1, {4, 5, 6, 7}),
                    rows(2, {2, 3}), rows(3, {2, 3})}) {
    want.insert(want.end(), part.begin(), part.end());
  }
  const auto got = floats(shard_of(*m, p->name, 0));
  EXPECT_EQ(column0(got, 2), want);
  // Column 1 follows column 0 in every row (rows are copied whole).
  for (std::size_t i = 0; i < got.size(); i += 2) EXPECT_EQ(got[i + 1], got[i] + 1) << i;
}

TEST(GqaLayout, EachTpRankHoldsItsOwnKvGroups) {
  auto m = build_mapping(hand_config(), MegatronLayout{.tp = 2}, DType::kF32);
  ASSERT_OK(m);
  const std::string name = "decoder.layers.0.self_attention.linear_qkv.weight";
  EXPECT_EQ(m->find_param(name)->shard_shape, (std::vector<std::int64_t>{8, 2}));
  std::vector<float> r0, r1;
  for (auto part : {rows(1, {0, 1, 2, 3}), rows(2, {0, 1}), rows(3, {0, 1})}) {
    r0.insert(r0.end(), part.begin(), part.end());
  }
  for (auto part : {rows(1, {4, 5, 6, 7}), rows(2, {2, 3}), rows(3, {2, 3})}) {
    r1.insert(r1.end(), part.begin(), part.end());
  }
  EXPECT_EQ(column0(floats(shard_of(*m, name, 0)), 2), r0);
  EXPECT_EQ(column0(floats(shard_of(*m, name, 1)), 2), r1);
  // The bias follows the same grouping.
  const std::string bias = "decoder.layers.0.self_attention.linear_qkv.bias";
  EXPECT_EQ(floats(shard_of(*m, bias, 1)), r1);
}

TEST(GqaLayout, Fc1RankHoldsItsGateThenItsUp) {
  auto m = build_mapping(hand_config(), MegatronLayout{.tp = 2}, DType::kF32);
  ASSERT_OK(m);
  const std::string name = "decoder.layers.0.mlp.linear_fc1.weight";
  // Rank 0: gate rows 0-1, up rows 0-1; rank 1: gate rows 2-3, up rows 2-3 — not [gate; up] cut.
  std::vector<float> r0 = rows(5, {0, 1}), r1 = rows(5, {2, 3});
  for (float v : rows(6, {0, 1})) r0.push_back(v);
  for (float v : rows(6, {2, 3})) r1.push_back(v);
  EXPECT_EQ(column0(floats(shard_of(*m, name, 0)), 2), r0);
  EXPECT_EQ(column0(floats(shard_of(*m, name, 1)), 2), r1);
}

TEST(GqaLayout, RowParallelSplitsColumns) {
  auto m = build_mapping(hand_config(), MegatronLayout{.tp = 2}, DType::kF32);
  ASSERT_OK(m);
  // o_proj [2, 8]: rank 1 holds columns 4-7 of both rows.
  const auto got = floats(shard_of(*m, "decoder.layers.0.self_attention.linear_proj.weight", 1));
  EXPECT_EQ(got, (std::vector<float>{404, 405, 406, 407, 414, 415, 416, 417}));
  EXPECT_EQ(m->find_param("decoder.layers.0.mlp.linear_fc2.weight")->shard_shape,
            (std::vector<std::int64_t>{2, 2}));
}

TEST(GqaLayout, PaddedVocabRowsAreZeros) {
  auto m =
      build_mapping(hand_config(), MegatronLayout{.tp = 2, .padded_vocab_size = 8}, DType::kF32);
  ASSERT_OK(m);
  // Rank 1 holds rows 4-7: rows 4-5 of the embedding, then two rows of padding.
  const auto got = floats(shard_of(*m, "embedding.word_embeddings.weight", 1));
  EXPECT_EQ(got, (std::vector<float>{940, 941, 950, 951, 0, 0, 0, 0}));
}

TEST(GqaLayout, RunsTileEveryShard) {
  for (const char* family : {"llama", "qwen2", "qwen3"}) {
    for (int tp : {1, 2, 4}) {
      auto m = build_mapping(testing::tiny_config(family), MegatronLayout{.tp = tp}, DType::kBF16);
      ASSERT_OK(m);
      for (const MegatronParam& p : m->params) {
        for (int r = 0; r < tp; ++r) {
          std::uint64_t at = 0;
          for (const convert::Run& run : shard_runs(*m, p, r)) {
            EXPECT_EQ(run.shard_offset, at) << p.name << " rank " << r;
            at += run.bytes();
          }
          EXPECT_EQ(at, m->shard_spec(p).bytes()) << p.name << " rank " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry::convert

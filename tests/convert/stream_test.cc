// The sender-side transform: Megatron shards in, HF pieces out, in any piece sizes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "convert/convert_test_util.h"
#include "support/status_matchers.h"

namespace ferry::convert {
namespace {

using testing::Bytes;

struct Case {
  const char* family;
  int tp;
  std::size_t piece;  // bytes per piece fed to split(); 0: whole shards
};

class StreamTest : public ::testing::TestWithParam<Case> {};

// Every rank's shards, fed in pieces, rebuild every HF tensor exactly, and each HF byte arrives
// once.
TEST_P(StreamTest, PiecesRebuildHfTensors) {
  const Case c = GetParam();
  auto m = build_mapping(testing::tiny_config(c.family), {.tp = c.tp, .padded_vocab_size = 104},
                         DType::kBF16);
  ASSERT_OK(m);
  const auto hf = testing::synthetic_hf(*m);
  std::vector<Bytes> rebuilt;
  std::vector<std::vector<int>> seen;
  for (const TensorSpec& t : m->hf_tensors) {
    rebuilt.emplace_back(t.bytes());
    seen.emplace_back(t.bytes(), 0);
  }
  std::mt19937 rng(42);
  for (int r = 0; r < c.tp; ++r) {
    auto stream = MegatronToHfStream::create(*m, r);
    ASSERT_OK(stream);
    for (const MegatronParam& p : m->params) {
      const Bytes shard = testing::build_shard(*m, p, r, hf);
      std::vector<HfPiece> pieces;
      for (std::size_t off = 0; off < shard.size();) {
        std::size_t n = shard.size() - off;
        if (c.piece > 0) n = std::min(n, 1 + rng() % c.piece);
        ASSERT_OK(stream->split(p.name, off, std::span(shard).subspan(off, n), &pieces));
        off += n;
      }
      for (const HfPiece& piece : pieces) {
        // Views, not copies: the piece points into the shard.
        EXPECT_GE(piece.data.data(), shard.data());
        EXPECT_LE(piece.data.data() + piece.data.size(), shard.data() + shard.size());
        std::memcpy(rebuilt[piece.hf_index].data() + piece.hf_offset, piece.data.data(),
                    piece.data.size());
        // Replicated tensors arrive from every rank; others exactly once.
        for (std::size_t b = 0; b < piece.data.size(); ++b)
          ++seen[piece.hf_index][piece.hf_offset + b];
      }
    }
  }
  for (std::size_t i = 0; i < m->hf_tensors.size(); ++i) {
    const std::string& name = m->hf_tensors[i].name;
    EXPECT_EQ(rebuilt[i], hf.at(name)) << name;
    const bool replicated = name.find("norm") != std::string::npos;
    const int want = replicated ? c.tp : 1;
    EXPECT_TRUE(std::all_of(seen[i].begin(), seen[i].end(), [&](int s) { return s == want; }))
        << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, StreamTest,
                         ::testing::Values(Case{"llama", 1, 0}, Case{"qwen2", 2, 0},
                                           Case{"qwen3", 4, 0}, Case{"llama", 2, 7},
                                           Case{"qwen2", 4, 33}, Case{"qwen3", 2, 1000}),
                         [](const auto& test_info) {
                           return std::string(test_info.param.family) + "_tp" +
                                  std::to_string(test_info.param.tp) + "_piece" +
                                  std::to_string(test_info.param.piece);
                         });

TEST(Stream, RejectsUnknownNamesAndRangesPastTheEnd) {
  auto m = build_mapping(testing::tiny_config("llama"), {}, DType::kBF16);
  ASSERT_OK(m);
  auto stream = MegatronToHfStream::create(*m, 0);
  ASSERT_OK(stream);
  std::vector<HfPiece> pieces;
  Bytes b(16);
  Status s = stream->split("decoder.layers.0.self_attention.q_layernorm.weight", 0, b, &pieces);
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("q_layernorm"));
  // final_layernorm holds 32 BF16 = 64 bytes.
  s = stream->split("decoder.final_layernorm.weight", 60, b, &pieces);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("64 bytes"));
  EXPECT_FALSE(MegatronToHfStream::create(*m, 1).ok());
}

}  // namespace
}  // namespace ferry::convert

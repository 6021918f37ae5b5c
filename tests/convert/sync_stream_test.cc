// The sender converts on the way: Megatron TP shards in, Hugging Face tensors out of a real
// shm sync session, bit-exact, and without a second copy of the model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "convert/convert_test_util.h"
#include "ferry/sync.h"
#include "support/status_matchers.h"

namespace ferry::convert {
namespace {

using testing::Bytes;

struct Shards {
  std::vector<std::vector<Bytes>> bytes;       // [rank][param]
  std::vector<std::vector<TensorView>> views;  // [rank][param]
};

Shards build_all(const Mapping& m, const std::map<std::string, Bytes>& hf) {
  Shards s;
  const int tp = m.layout.tp;
  s.bytes.resize(static_cast<std::size_t>(tp));
  s.views.resize(static_cast<std::size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    for (const MegatronParam& p : m.params) {
      s.bytes[static_cast<std::size_t>(r)].push_back(testing::build_shard(m, p, r, hf));
    }
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      s.views[static_cast<std::size_t>(r)].push_back(
          {m.shard_spec(m.params[i]), s.bytes[static_cast<std::size_t>(r)][i]});
    }
  }
  return s;
}

class SyncStreamTest : public ::testing::TestWithParam<std::pair<const char*, int>> {};

TEST_P(SyncStreamTest, ReceiverGetsHfTensorsFromMegatronShards) {
  const auto [family, tp] = GetParam();
  auto m = build_mapping(testing::tiny_config(family), {.tp = tp, .padded_vocab_size = 104},
                         DType::kBF16);
  ASSERT_OK(m);
  const auto hf = testing::synthetic_hf(*m);
  const Shards shards = build_all(*m, hf);
  auto gathered = gather_hf_tensors(*m, shards.views);
  ASSERT_OK(gathered);
  // Views into the shards, not copies.
  for (const auto& g : *gathered) {
    for (const auto& part : g.parts) {
      bool inside = false;
      for (const auto& rank : shards.bytes) {
        for (const Bytes& b : rank) {
          inside |= part.data() >= b.data() && part.data() + part.size() <= b.data() + b.size();
        }
      }
      EXPECT_TRUE(inside) << g.spec.name;
    }
  }

  sync::SyncOptions o;
  o.bucket_bytes = 512;  // fused tensors span buckets and their parts span pieces
  o.timeout = std::chrono::milliseconds(10'000);
  const std::string address = "@ferry-convert-test-" + std::to_string(::getpid()) + family;
  auto sender = sync::Sender::create(address, o);
  ASSERT_OK(sender);
  std::map<std::string, Bytes> got;
  std::thread rx([&] {
    auto r = sync::Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    auto s = (*r)->receive_round([&](const TensorView& t) {
      got[t.spec.name].assign(t.data.begin(), t.data.end());
      return ok_status();
    });
    ASSERT_OK(s);
  });
  ASSERT_OK((*sender)->accept(1));
  auto stats = (*sender)->send_round_gathered(*gathered);
  rx.join();
  ASSERT_OK(stats);
  ASSERT_EQ(got.size(), hf.size());
  for (const auto& [name, bytes] : hf) EXPECT_TRUE(got[name] == bytes) << name;
}

INSTANTIATE_TEST_SUITE_P(Families, SyncStreamTest,
                         ::testing::Values(std::pair{"llama", 1}, std::pair{"qwen2", 2},
                                           std::pair{"qwen3", 4}),
                         [](const auto& test_info) {
                           return std::string(test_info.param.first) + "_tp" +
                                  std::to_string(test_info.param.second);
                         });

TEST(GatherHfTensors, MissingRankOrShardIsNamed) {
  auto m = build_mapping(testing::tiny_config("qwen2"), {.tp = 2, .padded_vocab_size = 104},
                         DType::kBF16);
  ASSERT_OK(m);
  const auto hf = testing::synthetic_hf(*m);
  Shards shards = build_all(*m, hf);
  auto one_rank = gather_hf_tensors(*m, std::span(shards.views).first(1));
  ASSERT_FALSE(one_rank.ok());
  EXPECT_NE(one_rank.status().message().find("shards of 1 rank(s) given, the layout has tp = 2"),
            std::string::npos)
      << one_rank.status().message();
  const std::string dropped(shards.views[1][3].spec.name);
  shards.views[1].erase(shards.views[1].begin() + 3);
  auto missing = gather_hf_tensors(*m, shards.views);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("rank 1 gave no shard of '" + dropped + "'"),
            std::string::npos)
      << missing.status().message();
}

}  // namespace
}  // namespace ferry::convert

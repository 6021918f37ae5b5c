// Rank-local delivery: receivers that register TensorSlice destinations (here vLLM's slices
// from convert::vllm_tp_slices) get exactly their rank's slice of every tensor, checked against
// a reference slicing computed element by element from vLLM's rules, in buckets that cut rows
// and runs anywhere; they copy only those bytes (RoundStats::delivered_bytes), and vocabulary
// padding rows keep what the destination held.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "base/status_macros.h"
#include "ferry/multi_receiver.h"
#include "ferry/sender_parts.h"
#include "ferry/vllm_slices.h"
#include "support/status_matchers.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::unique_address;
using testing::Weights;

constexpr std::byte kUntouched{0xEE};

// A Qwen2-shaped model small enough to send in 1000-byte buckets: 4 query heads over 2
// key/value heads (tp 4 replicates them), q/k/v biases, a vocabulary that is not a multiple
// of 64 (padding rows on the last rank).
model::ModelConfig tiny_qwen2() {
  model::ModelConfig c;
  c.family = "qwen2";
  c.architecture = "Qwen2ForCausalLM";
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 96;
  c.qkv_bias = true;
  return c;
}

// The reference: rank `rank` of `tp`'s slice of `whole`, element by element, as vLLM's
// weight loaders narrow each tensor; padding rows are kUntouched. Written apart from
// vllm_slices.cc on purpose: rows and columns, not runs.
std::vector<std::byte> reference_slice(const model::ModelConfig& c, const TensorSpec& spec,
                                       std::span<const std::byte> whole, int rank, int tp) {
  const std::string& n = spec.name;
  const std::int64_t rows = spec.shape[0];
  const std::size_t row = spec.bytes() / rows;
  auto take_rows = [&](std::int64_t first, std::int64_t count, std::int64_t local_rows) {
    std::vector<std::byte> out(local_rows * row, kUntouched);
    for (std::int64_t r = 0; r < count && first + r < rows; ++r) {
      std::copy_n(whole.begin() + (first + r) * row, row, out.begin() + r * row);
    }
    return out;
  };
  auto has = [&](const char* module) { return n.find(module) != std::string::npos; };
  const std::int64_t d = c.head_dim;
  if (has("q_proj"))
    return take_rows(rank * (c.num_heads / tp) * d, c.num_heads / tp * d, c.num_heads / tp * d);
  if (has("k_proj") || has("v_proj")) {
    if (tp >= c.num_kv_heads) return take_rows(rank / (tp / c.num_kv_heads) * d, d, d);
    const std::int64_t per = c.num_kv_heads / tp * d;
    return take_rows(rank * per, per, per);
  }
  if (has("gate_proj") || has("up_proj")) {
    const std::int64_t per = c.intermediate_size / tp;
    return take_rows(rank * per, per, per);
  }
  if ((has("o_proj") || has("down_proj")) && n.ends_with("weight")) {
    const std::size_t element = 2;  // BF16
    const std::size_t cols = spec.shape[1] / tp;
    std::vector<std::byte> out;
    for (std::int64_t r = 0; r < rows; ++r) {
      auto from = whole.begin() + r * row + rank * cols * element;
      out.insert(out.end(), from, from + cols * element);
    }
    return out;
  }
  if (has("embed_tokens") || has("lm_head")) {
    const std::int64_t padded = (c.vocab_size + 63) / 64 * 64;
    const std::int64_t per = padded / tp;
    return take_rows(rank * per, std::min<std::int64_t>(per, c.vocab_size - rank * per), per);
  }
  return {whole.begin(), whole.end()};  // norms, row-parallel biases
}

struct RankResult {
  Result<RoundStats> stats = internal_error("unset");
  std::vector<TensorSlice> slices;
  std::vector<std::vector<std::byte>> local;
};

// Receives `rounds` rounds as rank `rank` of `tp` into its slices; the last round's result.
RankResult receive_as_rank(const std::string& address, const model::ModelConfig& config,
                           const std::vector<TensorSpec>& specs, int rank, int tp, int rounds,
                           const SyncOptions& options) {
  RankResult out;
  auto slices = convert::vllm_tp_slices(config, specs, rank, tp);
  if (!slices.ok()) {
    out.stats = slices.status();
    return out;
  }
  out.slices = std::move(*slices);
  auto rx = Receiver::connect(address, rank, options);
  if (!rx.ok()) {
    out.stats = rx.status();
    return out;
  }
  for (const TensorSlice& s : out.slices) {
    out.local.emplace_back(s.local.bytes(), kUntouched);
    if (Status st = (*rx)->set_destination(s, out.local.back()); !st.ok()) {
      out.stats = st;
      return out;
    }
  }
  for (int k = 0; k < rounds; ++k) out.stats = (*rx)->receive_round_into();
  return out;
}

void run_ranks(int tp, bool checksums) {
  const model::ModelConfig config = tiny_qwen2();
  const std::vector<TensorSpec> specs = model::hf_tensor_specs(config, DType::kBF16);
  SyncOptions options = testing::tiny_options();
  options.bucket_bytes = 1008;  // cuts rows, heads and strided blocks at odd places
  options.checksums = checksums;
  const std::string address = unique_address();
  auto sender = Sender::create(address, options);
  ASSERT_OK(sender);
  constexpr int kRounds = 2;
  std::vector<RankResult> results(tp);
  std::vector<std::thread> ranks;
  for (int r = 0; r < tp; ++r) {
    ranks.emplace_back(
        [&, r] { results[r] = receive_as_rank(address, config, specs, r, tp, kRounds, options); });
  }
  ASSERT_OK((*sender)->accept(tp));
  Weights sent;
  for (int k = 0; k < kRounds; ++k) {
    sent = make_weights(specs, 7 + k);
    auto views = sent.views();
    ASSERT_OK((*sender)->send_round(views)) << "round " << k;
  }
  for (auto& t : ranks) t.join();
  std::uint64_t model_bytes = 0;
  for (const TensorSpec& s : specs) model_bytes += s.bytes();
  for (int r = 0; r < tp; ++r) {
    ASSERT_OK(results[r].stats) << "rank " << r;
    std::uint64_t selected = 0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const auto expected = reference_slice(config, specs[i], sent.data[i], r, tp);
      EXPECT_EQ(results[r].local[i], expected) << specs[i].name << " rank " << r << " of " << tp;
      selected += results[r].slices[i].selected_bytes();
    }
    EXPECT_EQ(results[r].stats->bytes, model_bytes);
    EXPECT_EQ(results[r].stats->delivered_bytes, selected) << "rank " << r;
    if (tp > 1) {
      EXPECT_LT(results[r].stats->delivered_bytes, model_bytes * 3 / 4);
    }
  }
}

TEST(RankLocal, EachRankGetsExactlyItsVllmSliceOfEveryTensor) {
  for (int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    run_ranks(tp, /*checksums=*/true);
  }
}

TEST(RankLocal, WithoutChecksumsOnlyTheSlicesAreRead) { run_ranks(2, /*checksums=*/false); }

// Two trainer ranks each send a part (split_into_parts); each tensor-parallel rank merges
// the parts with a MultiReceiver into its slices.
TEST(RankLocal, SlicesFromTwoSendersThroughAMultiReceiver) {
  const model::ModelConfig config = tiny_qwen2();
  const std::vector<TensorSpec> specs = model::hf_tensor_specs(config, DType::kBF16);
  auto parts = split_into_parts(specs, 2);
  ASSERT_OK(parts);
  SyncOptions options = testing::tiny_options();
  options.bucket_bytes = 1008;
  const std::vector<std::string> addresses = {unique_address(), unique_address()};
  const Weights sent = make_weights(specs, 3);
  constexpr int kTp = 2;
  std::vector<Status> served(2);
  std::vector<std::thread> senders;
  for (int k = 0; k < 2; ++k) {
    senders.emplace_back([&, k] {
      auto sender = Sender::create(addresses[k], options);
      if (!sender.ok()) {
        served[k] = sender.status();
        return;
      }
      std::vector<TensorView> views;
      for (std::size_t i : (*parts)[k]) views.push_back({specs[i], sent.data[i]});
      served[k] = (*sender)->accept(kTp);
      if (served[k].ok()) served[k] = (*sender)->send_round(views).status();
    });
  }
  std::vector<RankResult> results(kTp);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kTp; ++r) {
    ranks.emplace_back([&, r] {
      RankResult& out = results[r];
      out.slices = *convert::vllm_tp_slices(config, specs, r, kTp);
      auto rx = MultiReceiver::connect(addresses, r, options);
      if (!rx.ok()) {
        out.stats = rx.status();
        return;
      }
      for (const TensorSlice& s : out.slices) {
        out.local.emplace_back(s.local.bytes(), kUntouched);
        ASSERT_OK((*rx)->set_destination(s, out.local.back()));
      }
      out.stats = (*rx)->receive_round_into();
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& t : senders) t.join();
  for (int k = 0; k < 2; ++k) ASSERT_OK(served[k]) << "sender " << k;
  for (int r = 0; r < kTp; ++r) {
    ASSERT_OK(results[r].stats) << "rank " << r;
    std::uint64_t selected = 0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(results[r].local[i], reference_slice(config, specs[i], sent.data[i], r, kTp))
          << specs[i].name << " rank " << r;
      selected += results[r].slices[i].selected_bytes();
    }
    EXPECT_EQ(results[r].stats->delivered_bytes, selected) << "rank " << r;
  }
}

TEST(RankLocal, VllmSlicesNameWhatTheyCannotSlice) {
  const model::ModelConfig config = tiny_qwen2();
  const auto specs = model::hf_tensor_specs(config, DType::kBF16);
  auto three = convert::vllm_tp_slices(config, specs, 0, 3);
  EXPECT_THAT(three.status().message(),
              ::testing::HasSubstr("size 3 does not divide the model's 4 attention heads"));
  auto bad_rank = convert::vllm_tp_slices(config, specs, 2, 2);
  EXPECT_THAT(bad_rank.status().message(), ::testing::HasSubstr("rank 2 of size 2"));
  std::vector<TensorSpec> odd = {
      *TensorSpec::make("model.layers.0.mlp.experts.0.w1", DType::kBF16, {4, 4})};
  auto unknown = convert::vllm_tp_slices(config, odd, 0, 2);
  EXPECT_THAT(
      unknown.status().message(),
      ::testing::HasSubstr("'model.layers.0.mlp.experts.0.w1': no vLLM tensor-parallel rule"));
  std::vector<TensorSpec> wrong = {
      *TensorSpec::make("model.layers.0.self_attn.q_proj.weight", DType::kBF16, {60, 64})};
  auto shape = convert::vllm_tp_slices(config, wrong, 0, 2);
  EXPECT_THAT(shape.status().message(), ::testing::HasSubstr("is [60, 64], but the config's"));
}

TEST(RankLocal, SlicesThatLeaveTheirTensorsAreRefusedByName) {
  const TensorSpec whole = *TensorSpec::make("w", DType::kBF16, {4, 8});
  const TensorSpec local = *TensorSpec::make("w", DType::kBF16, {4, 4});
  TensorSlice past_end{whole, local, {{.block_bytes = 8, .count = 4, .whole_stride = 16}}};
  past_end.runs[0].whole_offset = 16;  // the last block ends at byte 72 of 64
  EXPECT_THAT(past_end.check().message(), ::testing::HasSubstr("run 0 reaches byte 72"));
  TensorSlice overlapping{whole, local, {{.block_bytes = 16, .count = 2, .whole_stride = 8}}};
  EXPECT_THAT(overlapping.check().message(), ::testing::HasSubstr("overlap"));
  TensorSlice twice{whole, local, {{.block_bytes = 16}, {.whole_offset = 32, .block_bytes = 16}}};
  EXPECT_THAT(twice.check().message(), ::testing::HasSubstr("two runs write slice byte 0"));
  TensorSlice out_of_order{whole,
                           local,
                           {{.slice_offset = 16, .whole_offset = 32, .block_bytes = 16},
                            {.whole_offset = 0, .block_bytes = 16}}};
  EXPECT_THAT(out_of_order.check().message(), ::testing::HasSubstr("in order"));
  TensorSlice fine{whole, local, {{.block_bytes = 8, .count = 4, .whole_stride = 16}}};
  EXPECT_OK(fine.check());
}

TEST(RankLocal, ADeltaRoundIntoSlicesIsRefusedSayingWhy) {
  const model::ModelConfig config = tiny_qwen2();
  const auto specs = model::hf_tensor_specs(config, DType::kBF16);
  SyncOptions options = testing::tiny_options();
  options.bucket_bytes = 8 << 10;
  options.delta = DeltaMode::kOn;
  const std::string address = unique_address();
  auto sender = Sender::create(address, options);
  ASSERT_OK(sender);
  RankResult result;
  std::thread rank([&] { result = receive_as_rank(address, config, specs, 0, 2, 2, options); });
  ASSERT_OK((*sender)->accept(1));
  Weights w = make_weights(specs, 1);
  auto views = w.views();
  ASSERT_OK((*sender)->send_round(views));  // the first round has no base: dense
  w.data[0][0] ^= std::byte{1};
  views = w.views();
  EXPECT_FALSE((*sender)->send_round(views).ok());
  rank.join();
  EXPECT_THAT(result.stats.status().message(),
              ::testing::HasSubstr("takes dense rounds only (turn delta off on the sender)"));
}

}  // namespace
}  // namespace ferry::sync

// The codec seam (codec/tensor_codec.h) with a codec of the test's own: BEGIN names it, the
// round carries its payloads like any tensor, and receivers decode them in every delivery
// mode. A receiver that does not know the codec, or whose decoded bytes miss the sender's
// hash, refuses the round by name. This is what a new codec (FP8 on send) plugs into.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <map>
#include <thread>

#include "base/status_macros.h"
#include "codec/testing.h"
#include "support/status_matchers.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::small_model;
using testing::unique_address;
using testing::Weights;

constexpr std::uint8_t kXorId = 200;
constexpr std::byte kKey{0x5a};

// Payload = the tensor's bytes XOR a key. `wrong_hash_for` names a tensor whose target hash
// the sender gets wrong.
class XorSendCodec final : public codec::SendCodec {
 public:
  explicit XorSendCodec(std::string wrong_hash_for = {})
      : wrong_hash_for_(std::move(wrong_hash_for)) {}
  Result<codec::EncodedRound> encode(std::span<const GatheredTensor> tensors, bool) override {
    codec::EncodedRound round;
    round.codec = kXorId;
    buffers_.assign(tensors.size(), {});
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      std::vector<std::byte>& out = buffers_[i];
      for (const auto& part : tensors[i].parts) {
        for (std::byte b : part) out.push_back(b ^ kKey);
      }
      std::vector<std::byte> plain(out.size());
      for (std::size_t k = 0; k < out.size(); ++k) plain[k] = out[k] ^ kKey;
      std::uint64_t hash = XXH3_64bits(plain.data(), plain.size());
      if (tensors[i].spec.name == wrong_hash_for_) ++hash;
      round.targets.push_back({tensors[i].spec, hash});
      const auto n = static_cast<std::int64_t>(out.size());
      round.payloads.push_back({*TensorSpec::make(tensors[i].spec.name, DType::kU8, {n}), {out}});
      round.encoded_bytes += out.size();
    }
    return round;
  }
  void round_sent(bool, std::uint64_t) override {}
  void reset() override {}

 private:
  std::string wrong_hash_for_;
  std::vector<std::vector<std::byte>> buffers_;
};

class XorReceiveCodec final : public codec::ReceiveCodec {
 public:
  std::string_view name() const override { return "xor"; }
  bool decodes_onto_base() const override { return false; }
  Status decode(std::span<const std::byte> payload, std::span<std::byte> onto,
                std::string_view what) const override {
    if (payload.size() != onto.size()) {
      return corruption(std::string(what) + ": payload and tensor differ in size");
    }
    for (std::size_t k = 0; k < onto.size(); ++k) onto[k] = payload[k] ^ kKey;
    return ok_status();
  }
};

const XorReceiveCodec kXor;

enum class Mode { kDestinations, kTensors, kBuckets };

// Receives `rounds` rounds in `mode`; each round's tensors by name, or the first error.
Result<std::vector<std::map<std::string, std::vector<std::byte>>>> receive(
    const std::string& address, std::uint32_t id, Mode mode, int rounds) {
  FERRY_ASSIGN_OR_RETURN(auto r, Receiver::connect(address, id, testing::tiny_options()));
  std::vector<std::vector<std::byte>> dst;
  for (const TensorSpec& spec : small_model()) {
    dst.emplace_back(spec.bytes(), std::byte{0});
    FERRY_RETURN_IF_ERROR(r->set_destination({spec, dst.back()}));
  }
  std::vector<std::map<std::string, std::vector<std::byte>>> got(rounds);
  for (int k = 0; k < rounds; ++k) {
    auto keep = [&](const TensorView& t) {
      got[k][t.spec.name].assign(t.data.begin(), t.data.end());
    };
    Result<RoundStats> stats = internal_error("unset");
    if (mode == Mode::kDestinations) {
      stats = r->receive_round_into();
      for (std::size_t i = 0; i < dst.size(); ++i) got[k][small_model()[i].name] = dst[i];
    } else if (mode == Mode::kTensors) {
      stats = r->receive_round([&](const TensorView& t) {
        keep(t);
        return ok_status();
      });
    } else {
      stats = r->receive_round_buckets([&](std::span<const TensorView> ts, bool) {
        for (const TensorView& t : ts) keep(t);
        return ok_status();
      });
    }
    if (!stats.ok()) return stats.status();
    if (!stats->delta) return internal_error("a round of the test codec arrived unencoded");
  }
  return got;
}

TEST(CodecSeam, ACodecOfItsOwnCarriesRoundsBitExactInEveryMode) {
  codec::testing::ScopedSendCodecFactory send([] { return std::make_unique<XorSendCodec>(); });
  codec::testing::ScopedExtraReceiveCodec receive_xor({kXorId, &kXor});
  const std::string address = unique_address();
  auto sender = Sender::create(address, testing::tiny_options());
  ASSERT_OK(sender);
  constexpr int kRounds = 3;
  std::vector<Result<std::vector<std::map<std::string, std::vector<std::byte>>>>> got(
      3, internal_error("unset"));
  std::vector<std::thread> rx;
  for (int m = 0; m < 3; ++m) {
    rx.emplace_back([&, m] { got[m] = receive(address, m, static_cast<Mode>(m), kRounds); });
  }
  ASSERT_OK((*sender)->accept(3));
  std::vector<Weights> sent;
  for (int k = 0; k < kRounds; ++k) {
    sent.push_back(make_weights(small_model(), 100 + k));
    auto views = sent.back().views();
    auto stats = (*sender)->send_round(views);
    ASSERT_OK(stats) << "round " << k;
    EXPECT_TRUE(stats->delta);  // RoundStats::delta: the round went encoded
  }
  for (auto& t : rx) t.join();
  for (int m = 0; m < 3; ++m) {
    ASSERT_OK(got[m]) << "mode " << m;
    for (int k = 0; k < kRounds; ++k) {
      for (std::size_t i = 0; i < sent[k].specs.size(); ++i) {
        EXPECT_EQ((*got[m])[k][sent[k].specs[i].name], sent[k].data[i])
            << "mode " << m << " round " << k << " tensor " << sent[k].specs[i].name;
      }
    }
  }
}

TEST(CodecSeam, AReceiverThatDoesNotKnowTheCodecRefusesTheRoundNamingIt) {
  codec::testing::ScopedSendCodecFactory send([] { return std::make_unique<XorSendCodec>(); });
  const std::string address = unique_address();
  auto sender = Sender::create(address, testing::tiny_options());
  ASSERT_OK(sender);
  Status received;
  std::thread rx([&] { received = receive(address, 0, Mode::kTensors, 1).status(); });
  ASSERT_OK((*sender)->accept(1));
  Weights w = make_weights(small_model(), 7);
  auto views = w.views();
  const Status sent = (*sender)->send_round(views).status();
  rx.join();
  EXPECT_EQ(received.code(), Code::kFailedPrecondition) << received.to_string();
  EXPECT_NE(received.message().find("codec 200, which this receiver does not know"),
            std::string::npos)
      << received.message();
  EXPECT_FALSE(sent.ok());
  EXPECT_NE(sent.message().find("codec 200"), std::string::npos) << sent.message();
}

TEST(CodecSeam, DecodedBytesThatMissTheSendersHashAreNamedByTensor) {
  codec::testing::ScopedSendCodecFactory send(
      [] { return std::make_unique<XorSendCodec>("lm_head.weight"); });
  codec::testing::ScopedExtraReceiveCodec receive_xor({kXorId, &kXor});
  const std::string address = unique_address();
  auto sender = Sender::create(address, testing::tiny_options());
  ASSERT_OK(sender);
  Status received;
  std::thread rx([&] { received = receive(address, 0, Mode::kDestinations, 1).status(); });
  ASSERT_OK((*sender)->accept(1));
  Weights w = make_weights(small_model(), 8);
  auto views = w.views();
  EXPECT_FALSE((*sender)->send_round(views).ok());
  rx.join();
  EXPECT_EQ(received.code(), Code::kCorruption) << received.to_string();
  EXPECT_NE(received.message().find("tensor 'lm_head.weight': after the xor"), std::string::npos)
      << received.message();
}

}  // namespace
}  // namespace ferry::sync

// The delta codec on its own, through the seam's interfaces (codec/tensor_codec.h): what a
// sender's rounds encode to, and a receiver's decoding of them. Rounds end to end are in
// tests/sync/delta_round_test.cc.
#include "codec/delta_codec.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <vector>

#include "codec/registry.h"
#include "support/status_matchers.h"

namespace ferry::codec {
namespace {

// As the registry makes it for SyncOptions::delta = mode (sync's tests cover that choice:
// SyncOptions itself belongs to the sync module).
std::unique_ptr<SendCodec> delta_codec(sync::DeltaMode mode = sync::DeltaMode::kOn) {
  return std::make_unique<DeltaSendCodec>(DeltaCodecOptions{mode, UINT64_MAX, 1});
}

struct Tensor {
  TensorSpec spec;
  std::vector<std::byte> bytes;
};

Tensor make_tensor(const std::string& name, std::size_t n, int seed) {
  Tensor t{*TensorSpec::make(name, DType::kU8, {static_cast<std::int64_t>(n)}), {}};
  for (std::size_t i = 0; i < n; ++i) t.bytes.push_back(static_cast<std::byte>(i * 7 + seed));
  return t;
}

std::vector<sync::GatheredTensor> gathered(const std::vector<Tensor>& ts) {
  std::vector<sync::GatheredTensor> out;
  for (const Tensor& t : ts) out.push_back({t.spec, {t.bytes}});
  return out;
}

std::vector<std::byte> payload_bytes(const sync::GatheredTensor& payload) {
  std::vector<std::byte> out;
  for (const auto& part : payload.parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

TEST(DeltaCodec, TheFirstRoundGoesDenseAndTheNextDecodesBitExactOntoIt) {
  auto codec = delta_codec();
  ASSERT_NE(codec, nullptr);
  std::vector<Tensor> v1 = {make_tensor("a", 4096, 1), make_tensor("b", 100, 2)};
  const auto g1 = gathered(v1);  // encode's tensors stay until round_sent()
  auto first = codec->encode(g1, false);
  ASSERT_OK(first);
  EXPECT_EQ(first->codec, wire::kDense);
  EXPECT_TRUE(first->keep_copies);  // later rounds decode onto what receivers keep
  codec->round_sent(true, 1);

  std::vector<Tensor> v2 = v1;
  v2[0].bytes[10] ^= std::byte{0xff};
  v2[1].bytes[99] ^= std::byte{0x01};
  const auto g2 = gathered(v2);
  auto second = codec->encode(g2, false);
  ASSERT_OK(second);
  ASSERT_EQ(second->codec, kDeltaId);
  EXPECT_EQ(second->base_version, 1u);
  ASSERT_EQ(second->payloads.size(), 2u);
  EXPECT_LT(second->encoded_bytes, 4096u + 100u);
  const ReceiveCodec* rx = receive_codec(second->codec);
  ASSERT_NE(rx, nullptr);
  EXPECT_TRUE(rx->decodes_onto_base());
  for (std::size_t i = 0; i < v1.size(); ++i) {
    EXPECT_EQ(second->targets[i].spec, v2[i].spec);
    EXPECT_EQ(second->targets[i].hash, XXH3_64bits(v2[i].bytes.data(), v2[i].bytes.size()));
    std::vector<std::byte> onto = v1[i].bytes;
    ASSERT_OK(rx->decode(payload_bytes(second->payloads[i]), onto, "tensor"));
    EXPECT_EQ(onto, v2[i].bytes) << v2[i].spec.name;
  }
  codec->round_sent(true, 2);
}

TEST(DeltaCodec, AfterAFailedRoundOrAReceiverJoiningTheNextRoundGoesDense) {
  auto codec = delta_codec();
  std::vector<Tensor> v = {make_tensor("a", 1000, 3)};
  const auto g = gathered(v);
  ASSERT_OK(codec->encode(g, false));
  codec->round_sent(true, 1);
  ASSERT_EQ(codec->encode(g, false)->codec, kDeltaId);
  codec->round_sent(false, 0);  // receivers hold nothing known
  EXPECT_EQ(codec->encode(g, false)->codec, wire::kDense);
  codec->round_sent(true, 3);
  codec->reset();  // accept() let a receiver join
  EXPECT_EQ(codec->encode(g, false)->codec, wire::kDense);
  codec->round_sent(true, 4);
}

TEST(DeltaCodec, AutoSendsDenseAndAsksNoCopiesWhenEveryPeerSharesMemory) {
  auto codec = delta_codec(sync::DeltaMode::kAuto);
  std::vector<Tensor> v = {make_tensor("a", 1000, 4)};
  const auto g = gathered(v);
  for (std::uint64_t version = 1; version <= 2; ++version) {
    auto round = codec->encode(g, /*all_peers_share_memory=*/true);
    ASSERT_OK(round);
    EXPECT_EQ(round->codec, wire::kDense);
    EXPECT_FALSE(round->keep_copies);
    codec->round_sent(true, version);
  }
}

TEST(DeltaCodec, ACorruptPayloadIsRefusedNamingTheTensorAndWritesNothing) {
  auto codec = delta_codec();
  std::vector<Tensor> v1 = {make_tensor("a", 4096, 5)};
  const auto g1 = gathered(v1);
  ASSERT_OK(codec->encode(g1, false));
  codec->round_sent(true, 1);
  std::vector<Tensor> v2 = v1;
  v2[0].bytes[0] ^= std::byte{0x10};
  const auto g2 = gathered(v2);
  auto round = codec->encode(g2, false);
  ASSERT_OK(round);
  ASSERT_EQ(round->codec, kDeltaId);
  std::vector<std::byte> payload = payload_bytes(round->payloads[0]);
  payload.back() ^= std::byte{0x80};
  std::vector<std::byte> onto = v1[0].bytes;
  const Status s = receive_codec(kDeltaId)->decode(payload, onto, "round 2 tensor 'a'");
  EXPECT_EQ(s.code(), Code::kCorruption) << s.to_string();
  EXPECT_NE(s.message().find("round 2 tensor 'a'"), std::string::npos) << s.message();
  EXPECT_EQ(onto, v1[0].bytes);
  codec->round_sent(false, 0);
}

TEST(CodecRegistry, KnowsDeltaAndNoOtherId) {
  ASSERT_NE(receive_codec(kDeltaId), nullptr);
  EXPECT_EQ(receive_codec(kDeltaId)->name(), "delta");
  EXPECT_EQ(receive_codec(wire::kDense), nullptr);
  EXPECT_EQ(receive_codec(2), nullptr);
  EXPECT_EQ(receive_codec(255), nullptr);
}

}  // namespace
}  // namespace ferry::codec

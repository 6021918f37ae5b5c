// SyncOptions::delta_keep_limit: a callback-mode receiver's copies for delta rounds are sized
// by the sender's BEGIN, so a round that would take them past the limit is refused before
// any copy is made, and the receiver's next session works. (And max_assembled_tensor_bytes,
// the same kind of bound on a tensor larger than a bucket.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "codec/registry.h"
#include "support/status_matchers.h"
#include "sync/kept_copies.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::unique_address;
using testing::Weights;

TensorSpec bytes_tensor(const std::string& name, std::int64_t bytes) {
  return *TensorSpec::make(name, DType::kU8, {bytes});
}

// A dense round that asks receivers to keep its tensors.
wire::Begin dense_keep_round(std::vector<TensorSpec> manifest) {
  wire::Begin b;
  b.manifest = std::move(manifest);
  b.keep_copies = 1;
  return b;
}

// A delta round from version 1 whose results are `targets`.
wire::Begin delta_round(const std::vector<TensorSpec>& targets) {
  wire::Begin b;
  b.codec = codec::kDeltaId;
  b.keep_copies = 1;
  b.base_version = 1;
  b.version = 2;
  for (const TensorSpec& t : targets) {
    b.manifest.push_back(bytes_tensor(t.name, 40));
    b.targets.push_back({t, 0});
  }
  return b;
}

// Keeps a copy of every tensor of `begin`, as a callback-mode receiver does once
// check passed.
void keep_all(KeptCopies& rx, const wire::Begin& begin) {
  for (const TensorSpec& spec : begin.manifest) {
    std::vector<std::byte> data(spec.bytes(), std::byte{1});
    rx.keep(TensorView{spec, data});
  }
}

void expect_refused_naming_limit(const Status& s, std::uint64_t limit) {
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("SyncOptions::delta_keep_limit"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(fmt::format("limit of {} bytes", limit)), std::string::npos)
      << s.message();
}

TEST(DeltaKeepLimit, RoundAtTheLimitIsKept) {
  KeptCopies rx(1000);
  const wire::Begin begin = dense_keep_round({bytes_tensor("a", 600), bytes_tensor("b", 400)});
  ASSERT_OK(rx.check(begin, 1));
  keep_all(rx, begin);
  EXPECT_EQ(rx.bytes(), 1000u);
  // Later rounds replace the copies of the names they give: not counted twice.
  EXPECT_OK(rx.check(delta_round({bytes_tensor("a", 600), bytes_tensor("b", 400)}), 2));
}

TEST(DeltaKeepLimit, OneBytePastTheLimitIsRefusedBeforeAnyCopy) {
  KeptCopies rx(1000);
  const Status s = rx.check(dense_keep_round({bytes_tensor("a", 600), bytes_tensor("b", 401)}), 1);
  expect_refused_naming_limit(s, 1000);
  EXPECT_NE(s.message().find("asks 1001 bytes"), std::string::npos) << s.message();
  EXPECT_EQ(rx.bytes(), 0u);
}

TEST(DeltaKeepLimit, CopiesOfTensorsTheRoundDoesNotNameCount) {
  KeptCopies rx(1000);
  const wire::Begin first = dense_keep_round({bytes_tensor("a", 500)});
  ASSERT_OK(rx.check(first, 1));
  keep_all(rx, first);
  // More rounds of one update (more_follows) keep other tensors beside "a".
  EXPECT_OK(rx.check(dense_keep_round({bytes_tensor("b", 500)}), 2));
  const Status s = rx.check(dense_keep_round({bytes_tensor("b", 501)}), 2);
  expect_refused_naming_limit(s, 1000);
  EXPECT_NE(s.message().find("with the 500 bytes kept for other tensors"), std::string::npos)
      << s.message();
  EXPECT_EQ(rx.bytes(), 500u);
}

// A delta's targets are sized by BEGIN alone, whatever its blobs hold: a hostile sender
// names an exabyte behind a 40-byte blob. check() refuses it, so no copy is made.
TEST(DeltaKeepLimit, HugeDeltaTargetIsRefusedAndNothingIsAllocated) {
  KeptCopies rx(1000);
  const wire::Begin first = dense_keep_round({bytes_tensor("a", 100)});
  ASSERT_OK(rx.check(first, 1));
  keep_all(rx, first);
  const std::int64_t exabyte = std::int64_t{1} << 60;
  expect_refused_naming_limit(rx.check(delta_round({bytes_tensor("a", exabyte)}), 2), 1000);
  // Sizes that would wrap a 64-bit sum are refused too, not wrapped under the limit.
  // (A spec holds at most 2^61 bytes: its bit count fits 64 bits.)
  std::vector<TensorSpec> wrapping;
  for (int i = 0; i < 9; ++i)
    wrapping.push_back(bytes_tensor(fmt::format("t{}", i), exabyte * 2 - 1));
  expect_refused_naming_limit(rx.check(delta_round(wrapping), 2), 1000);
  EXPECT_EQ(rx.bytes(), 100u);
}

TEST(DeltaKeepLimit, NameGivenTwiceIsRefused) {
  KeptCopies rx;
  const Status s = rx.check(delta_round({bytes_tensor("a", 10), bytes_tensor("a", 20)}), 2);
  EXPECT_EQ(s.code(), Code::kCorruption) << s.to_string();
  EXPECT_NE(s.message().find("names tensor 'a' twice"), std::string::npos) << s.message();
}

// End to end, in tensor-callback mode.
std::vector<TensorSpec> model() {
  return {*TensorSpec::make("embed", DType::kBF16, {64, 70}),
          *TensorSpec::make("norm", DType::kF32, {37}),
          *TensorSpec::make("head", DType::kF16, {33, 20})};
}

std::uint64_t model_bytes() {
  std::uint64_t n = 0;
  for (const TensorSpec& s : model()) n += s.bytes();
  return n;
}

SyncOptions options(std::uint64_t keep_limit) {
  SyncOptions o;
  o.bucket_bytes = 4 << 10;
  o.timeout = std::chrono::milliseconds(10'000);
  o.delta = DeltaMode::kOn;
  o.delta_keep_limit = keep_limit;
  return o;
}

struct Received {
  Status status;
  std::vector<bool> delta;
  std::map<std::string, std::vector<std::byte>> tensors;
};

// Joins `address` and receives `rounds` rounds through the tensor callback, or until one fails.
Received receive(const std::string& address, std::uint64_t keep_limit, int rounds) {
  Received got;
  auto r = Receiver::connect(address, 0, options(keep_limit));
  if (!r.ok()) {
    got.status = r.status();
    return got;
  }
  for (int i = 0; i < rounds; ++i) {
    auto stats = (*r)->receive_round([&](const TensorView& t) {
      got.tensors[t.spec.name].assign(t.data.begin(), t.data.end());
      return ok_status();
    });
    if (!stats.ok()) {
      got.status = stats.status();
      return got;
    }
    got.delta.push_back(stats->delta);
  }
  return got;
}

// A dense round, then a delta round; returns the weights sent last.
Weights send_two_rounds(Sender& sender, Status* sent) {
  Weights w = make_weights(model(), 7);
  for (int i = 0; i < 2 && sent->ok(); ++i) {
    if (i > 0) w.data[0][5] ^= std::byte{0x10};
    auto views = w.views();
    *sent = sender.send_round(views).status();
  }
  return w;
}

void expect_holds(const Received& got, const Weights& w) {
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    const auto it = got.tensors.find(w.specs[i].name);
    ASSERT_NE(it, got.tensors.end()) << w.specs[i].name;
    EXPECT_EQ(it->second, w.data[i]) << w.specs[i].name;
  }
}

TEST(DeltaKeepLimit, ReceiverAtTheLimitGetsDenseThenDelta) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, options(SyncOptions{}.delta_keep_limit));
  ASSERT_OK(sender);
  Received got;
  std::thread rx([&] { got = receive(address, model_bytes(), 2); });
  ASSERT_OK((*sender)->accept(1));
  Status sent;
  const Weights w = send_two_rounds(**sender, &sent);
  rx.join();
  EXPECT_OK(sent);
  ASSERT_OK(got.status);
  EXPECT_EQ(got.delta, (std::vector<bool>{false, true}));
  expect_holds(got, w);
}

// One byte short: the first round (dense, to be kept) is refused naming the limit; the
// sender's round fails; a receiver given room joins the next session and gets every round.
TEST(DeltaKeepLimit, ReceiverOneByteShortRefusesThenNextSessionWorks) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, options(SyncOptions{}.delta_keep_limit));
  ASSERT_OK(sender);
  Received refused;
  std::thread rx([&] { refused = receive(address, model_bytes() - 1, 1); });
  ASSERT_OK((*sender)->accept(1));
  const Weights first = make_weights(model(), 3);
  auto views = first.views();
  EXPECT_FALSE((*sender)->send_round(views).ok());
  rx.join();
  expect_refused_naming_limit(refused.status, model_bytes() - 1);
  EXPECT_NE(refused.status.message().find(fmt::format("asks {} bytes", model_bytes())),
            std::string::npos)
      << refused.status.message();
  EXPECT_TRUE(refused.tensors.empty());

  Received got;
  std::thread again([&] { got = receive(address, model_bytes(), 2); });
  ASSERT_OK((*sender)->accept(1));
  Status sent;
  const Weights w = send_two_rounds(**sender, &sent);
  again.join();
  EXPECT_OK(sent);
  ASSERT_OK(got.status);
  EXPECT_EQ(got.delta, (std::vector<bool>{false, true}));
  expect_holds(got, w);
}

// Rounds that keep nothing (a sender without delta rounds) take no copies, so the limit
// does not bound them: a callback-mode receiver with a 10-byte limit takes 1000 bytes.
TEST(DeltaKeepLimit, RoundsThatKeepNothingAreNotBounded) {
  SyncOptions o = options(10);
  o.delta = DeltaMode::kOff;
  const std::string address = unique_address();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  std::uint64_t got = 0;
  Status received;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    if (!r.ok()) {
      received = r.status();
      return;
    }
    received = (*r)->receive_round([&](const TensorView& t) {
                     got += t.data.size();
                     return ok_status();
                   })
                   .status();
  });
  ASSERT_OK((*sender)->accept(1));
  const Weights w = make_weights({bytes_tensor("a", 1000)}, 3);
  auto views = w.views();
  EXPECT_OK((*sender)->send_round(views));
  rx.join();
  EXPECT_OK(received);
  EXPECT_EQ(got, 1000u);
}

// A tensor larger than a bucket is assembled whole in callback modes, in memory of the size
// BEGIN gives: a hostile sender could name an exabyte. max_assembled_tensor_bytes bounds it,
// at BEGIN; destination mode assembles nothing and takes the same tensor under the same limit.
TEST(AssembledTensorLimit, ATensorSpanningBucketsPastTheLimitIsRefusedInCallbackModes) {
  const TensorSpec big = bytes_tensor("embed", 10'000);  // 3 buckets of 4 KiB
  SyncOptions o = options(SyncOptions{}.delta_keep_limit);
  o.delta = DeltaMode::kOff;
  o.max_assembled_tensor_bytes = 9'999;
  const std::string address = unique_address();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  Status refused;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    if (!r.ok()) {
      refused = r.status();
      return;
    }
    refused = (*r)->receive_round([](const TensorView&) { return ok_status(); }).status();
  });
  ASSERT_OK((*sender)->accept(1));
  const Weights w = make_weights({big}, 5);
  auto views = w.views();
  EXPECT_FALSE((*sender)->send_round(views).ok());
  rx.join();
  EXPECT_EQ(refused.code(), Code::kResourceExhausted) << refused.to_string();
  EXPECT_NE(refused.message().find("tensor 'embed' spans buckets"), std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find("limit of 9999 bytes (SyncOptions::max_assembled_tensor_bytes)"),
            std::string::npos)
      << refused.message();

  std::vector<std::byte> into(big.bytes());
  Status got;
  std::thread dst([&] {
    auto r = Receiver::connect(address, 0, o);
    if (!r.ok()) {
      got = r.status();
      return;
    }
    got = (*r)->set_destination({big, into});
    if (got.ok()) got = (*r)->receive_round_into().status();
  });
  ASSERT_OK((*sender)->accept(1));
  EXPECT_OK((*sender)->send_round(views).status());
  dst.join();
  EXPECT_OK(got);
  EXPECT_EQ(into, w.data[0]);

  // Exactly at the limit, callback mode assembles it (a session of its own: receiver 0 of
  // the last one still counts as joined).
  SyncOptions at_limit = o;
  at_limit.max_assembled_tensor_bytes = big.bytes();
  const std::string other = unique_address();
  auto second = Sender::create(other, at_limit);
  ASSERT_OK(second);
  std::vector<std::byte> assembled;
  std::thread cb([&] {
    auto r = Receiver::connect(other, 0, at_limit);
    if (!r.ok()) {
      got = r.status();
      return;
    }
    got = (*r)->receive_round([&](const TensorView& t) {
                assembled.assign(t.data.begin(), t.data.end());
                return ok_status();
              })
              .status();
  });
  ASSERT_OK((*second)->accept(1));
  EXPECT_OK((*second)->send_round(views).status());
  cb.join();
  EXPECT_OK(got);
  EXPECT_EQ(assembled, w.data[0]);
}

}  // namespace
}  // namespace ferry::sync

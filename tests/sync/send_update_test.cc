// Sender::send_update: one call per update that streams against the last update's manifest
// and stages (learning the manifest anew) when it changed, bit-exact at the receivers either
// way.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <thread>

#include "ferry/sync.h"
#include "support/status_matchers.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::small_model;
using testing::tiny_options;
using testing::unique_address;
using testing::Weights;

// The tensors of `w` in order, one per call, then the end.
UpdateStream stream_of(const Weights& w) {
  auto index = std::make_shared<std::size_t>(0);
  return [&w, index]() -> Result<std::optional<TensorView>> {
    if (*index == w.specs.size()) return std::optional<TensorView>();
    const std::size_t i = (*index)++;
    return std::optional<TensorView>(TensorView{w.specs[i], w.data[i]});
  };
}

// What a receiver got of one update: each name's last bytes, and the rounds it took.
struct Received {
  std::map<std::string, std::vector<std::byte>> tensors;
  int rounds = 0;
  std::optional<std::uint64_t> step;
};

Result<Received> receive_update(Receiver& r) {
  Received got;
  while (true) {
    Result<RoundStats> stats = r.receive_round([&](const TensorView& t) {
      got.tensors[t.spec.name].assign(t.data.begin(), t.data.end());
      return ok_status();
    });
    if (!stats.ok()) return stats.status();
    ++got.rounds;
    got.step = stats->step;
    if (!stats->more_follows) return got;
  }
}

void expect_bit_exact(const Received& got, const Weights& w) {
  ASSERT_EQ(got.tensors.size(), w.specs.size());
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    auto it = got.tensors.find(w.specs[i].name);
    ASSERT_NE(it, got.tensors.end()) << w.specs[i].name;
    EXPECT_EQ(it->second, w.data[i]) << w.specs[i].name;
  }
}

// A sender with one receiver, which receives updates on its own thread on request.
class SendUpdate : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = tiny_options();
    address_ = unique_address();
    auto s = Sender::create(address_, options_);
    ASSERT_OK(s);
    sender_ = std::move(*s);
    join();
  }

  void join() {
    std::thread t([&] {
      auto r = Receiver::connect(address_, 0, options_);
      ASSERT_OK(r);
      receiver_ = std::move(*r);
    });
    ASSERT_OK(sender_->accept(1));
    t.join();
  }

  // Sends `w` as one update while the receiver receives it.
  std::pair<Result<UpdateStats>, Result<Received>> update(const Weights& w, UpdateOptions o = {}) {
    Result<Received> got = aborted("not received");
    std::thread rx([&] { got = receive_update(*receiver_); });
    Result<UpdateStats> sent = sender_->send_update(stream_of(w), o);
    rx.join();
    return {std::move(sent), std::move(got)};
  }

  SyncOptions options_;
  std::string address_;
  std::unique_ptr<Sender> sender_;
  std::unique_ptr<Receiver> receiver_;
};

TEST_F(SendUpdate, SameManifestStreamsInOneRound) {
  const std::vector<TensorSpec> specs = small_model();
  std::uint64_t total = 0;
  for (const TensorSpec& s : specs) total += s.bytes();
  const Weights first = make_weights(specs, 1);
  auto [sent, got] = update(first, {.step = 7});
  ASSERT_OK(sent);
  ASSERT_OK(got);
  EXPECT_FALSE(sent->streamed);  // nothing learned yet: staged
  ASSERT_TRUE(sender_->update_manifest().has_value());
  EXPECT_EQ(*sender_->update_manifest(), specs);
  EXPECT_EQ(sent->bytes, total);
  EXPECT_EQ(sent->tensors, specs.size());
  EXPECT_EQ(got->step, 7u);
  expect_bit_exact(*got, first);

  for (std::uint64_t seed = 2; seed <= 3; ++seed) {
    const Weights next = make_weights(specs, seed);
    auto [s2, g2] = update(next, {.step = 7 + seed});
    ASSERT_OK(s2);
    ASSERT_OK(g2);
    EXPECT_TRUE(s2->streamed);
    EXPECT_EQ(s2->rounds, 1u);
    EXPECT_EQ(g2->rounds, 1);
    EXPECT_EQ(s2->bytes, total);
    EXPECT_EQ(g2->step, 7 + seed);
    expect_bit_exact(*g2, next);
  }
}

TEST_F(SendUpdate, ChangedManifestIsStagedCorrectlyThenStreamed) {
  std::vector<TensorSpec> specs = small_model();
  ASSERT_OK(update(make_weights(specs, 1)).first);
  // The first tensor changes shape: seen before BEGIN, so the update is staged, not failed.
  specs[0] = *TensorSpec::make(specs[0].name, specs[0].dtype, {65, 37});
  specs.push_back(*TensorSpec::make("extra.weight", DType::kF32, {11}));
  const Weights changed = make_weights(specs, 2);
  auto [sent, got] = update(changed);
  ASSERT_OK(sent);
  ASSERT_OK(got);
  EXPECT_FALSE(sent->streamed);
  expect_bit_exact(*got, changed);
  // The changed manifest was learned: the next update with it streams.
  const Weights again = make_weights(specs, 3);
  auto [s3, g3] = update(again);
  ASSERT_OK(s3);
  ASSERT_OK(g3);
  EXPECT_TRUE(s3->streamed);
  expect_bit_exact(*g3, again);
}

TEST_F(SendUpdate, ManifestChangedMidStreamFailsNamingTheTensorThenStages) {
  std::vector<TensorSpec> specs = small_model();
  ASSERT_OK(update(make_weights(specs, 1)).first);
  std::vector<TensorSpec> changed = specs;
  changed[3] = *TensorSpec::make("model.layers.0.renamed", DType::kF4, {10});
  auto [sent, got] = update(make_weights(changed, 2));
  ASSERT_EQ(sent.status().code(), Code::kInvalidArgument);
  EXPECT_NE(sent.status().message().find(
                "tensor 3 is 'model.layers.0.renamed' F4[10], but the manifest has "
                "'model.layers.0.packed' F4[10] there"),
            std::string::npos)
      << sent.status().to_string();
  EXPECT_FALSE(got.ok());  // the receiver's round was aborted, not delivered
  EXPECT_FALSE(sender_->update_manifest().has_value());
  // The session broke; once the receiver joins again, the new manifest is staged and sent.
  join();
  const Weights w = make_weights(changed, 3);
  auto [s2, g2] = update(w);
  ASSERT_OK(s2);
  ASSERT_OK(g2);
  EXPECT_FALSE(s2->streamed);
  expect_bit_exact(*g2, w);
}

TEST_F(SendUpdate, MissingAndExtraTensorsFailAStreamedUpdate) {
  const std::vector<TensorSpec> specs = small_model();
  ASSERT_OK(update(make_weights(specs, 1)).first);
  Weights fewer = make_weights(specs, 2);
  fewer.specs.pop_back();
  fewer.data.pop_back();
  auto [s1, g1] = update(fewer);
  ASSERT_EQ(s1.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s1.status().message().find("ended before tensor 6 'lm_head.weight'"), std::string::npos)
      << s1.status().to_string();
  join();
  ASSERT_OK(update(make_weights(specs, 3)).first);  // staged: learns it again
  std::vector<TensorSpec> more = specs;
  more.push_back(*TensorSpec::make("extra", DType::kU8, {3}));
  auto [s2, g2] = update(make_weights(more, 4));
  ASSERT_EQ(s2.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s2.status().message().find("tensor 7 'extra' is one more than the 7"),
            std::string::npos)
      << s2.status().to_string();
}

TEST_F(SendUpdate, StagingSplitsRoundsAndSendsLargeTensorsAlone) {
  const std::vector<TensorSpec> specs = small_model();  // embed: 9472 bytes, lm_head 3034
  const Weights w = make_weights(specs, 5);
  auto [sent, got] = update(w, {.staging_bytes = 4096});
  ASSERT_OK(sent);
  ASSERT_OK(got);
  EXPECT_FALSE(sent->streamed);
  // embed alone (larger than the buffer), then the small ones with lm_head (one round), so
  // at least 2 rounds; every round but the last said more_follows.
  EXPECT_GE(sent->rounds, 2u);
  EXPECT_EQ(got->rounds, static_cast<int>(sent->rounds));
  expect_bit_exact(*got, w);
}

TEST_F(SendUpdate, ANameTwiceStartsARoundAndIsNotLearned) {
  std::vector<TensorSpec> specs = small_model();
  specs.push_back(specs[1]);  // input_layernorm again, last
  Weights w = make_weights(specs, 6);
  auto [sent, got] = update(w);
  ASSERT_OK(sent);
  ASSERT_OK(got);
  EXPECT_EQ(sent->rounds, 2u);
  EXPECT_EQ(got->tensors.at(specs[1].name), w.data.back());  // the later one
  // Names were not unique: nothing learned, so the same update is staged again.
  auto [s2, g2] = update(w);
  ASSERT_OK(s2);
  EXPECT_FALSE(s2->streamed);
}

TEST_F(SendUpdate, AStreamErrorBeforeAnythingWasSentLeavesTheSessionIntact) {
  const UpdateStream failing = []() -> Result<std::optional<TensorView>> {
    return aborted("the trainer's generator failed");
  };
  Result<UpdateStats> r = sender_->send_update(failing);
  ASSERT_EQ(r.status().code(), Code::kAborted);
  const Weights w = make_weights(small_model(), 7);
  auto [sent, got] = update(w);  // no accept(): the session is the same
  ASSERT_OK(sent);
  ASSERT_OK(got);
  expect_bit_exact(*got, w);
}

// UpdateWriter, the object send_update loops over, driven by its caller.
TEST_F(SendUpdate, AnUpdatePushedTensorByTensorStreamsTheSecondTime) {
  const std::vector<TensorSpec> specs = small_model();
  for (std::uint64_t seed = 1; seed <= 2; ++seed) {
    const Weights w = make_weights(specs, seed);
    Result<Received> got = aborted("not received");
    std::thread rx([&] { got = receive_update(*receiver_); });
    Sender* one = sender_.get();
    auto writer = UpdateWriter::begin(std::span<Sender* const>(&one, 1), {.step = seed});
    ASSERT_OK(writer);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      std::vector<std::byte> bytes = w.data[i];  // freed before the next put: copied by then
      ASSERT_OK((*writer)->put(TensorView{specs[i], bytes}));
      std::fill(bytes.begin(), bytes.end(), std::byte{0xEE});
    }
    auto sent = (*writer)->finish();
    rx.join();
    ASSERT_OK(sent);
    ASSERT_OK(got);
    EXPECT_EQ((*sent)[0].streamed, seed == 2);
    EXPECT_EQ((*sent)[0].last_round.step, seed);
    EXPECT_EQ(got->step, seed);
    expect_bit_exact(*got, w);
    EXPECT_EQ((*writer)->put(TensorView{specs[0], w.data[0]}).code(), Code::kFailedPrecondition);
  }
}

TEST_F(SendUpdate, WhileAnUpdateIsOpenItsSenderRefusesOtherRoundsAndAnAbortFreesIt) {
  const std::vector<TensorSpec> specs = small_model();
  const Weights w = make_weights(specs, 1);
  Sender* one = sender_.get();
  auto writer = UpdateWriter::begin(std::span<Sender* const>(&one, 1));
  ASSERT_OK(writer);
  const Status busy = sender_->send_round(std::vector<TensorView>{{specs[0], w.data[0]}}).status();
  EXPECT_EQ(busy.code(), Code::kFailedPrecondition);
  EXPECT_NE(busy.message().find("an update (UpdateWriter) is open"), std::string::npos)
      << busy.to_string();
  EXPECT_EQ(sender_->accept(1).code(), Code::kFailedPrecondition);
  EXPECT_EQ(UpdateWriter::begin(std::span<Sender* const>(&one, 1)).status().code(),
            Code::kFailedPrecondition);
  // Aborted before any tensor: nothing went out, the session is intact (no accept()).
  (*writer)->abort(aborted("the trainer's generator failed"));
  auto [sent, got] = update(w);
  ASSERT_OK(sent);
  ASSERT_OK(got);
  expect_bit_exact(*got, w);
}

TEST_F(SendUpdate, AStreamedUpdateAbortedOrDroppedMidwayFailsTheReceiverNamingTheTensor) {
  const std::vector<TensorSpec> specs = small_model();
  ASSERT_OK(update(make_weights(specs, 1)).first);  // learned: the next one streams
  for (bool drop : {false, true}) {
    const Weights w = make_weights(specs, 2);
    Result<Received> got = aborted("not received");
    std::thread rx([&] { got = receive_update(*receiver_); });
    Sender* one = sender_.get();
    auto writer = UpdateWriter::begin(std::span<Sender* const>(&one, 1));
    ASSERT_OK(writer);
    ASSERT_OK((*writer)->put(TensorView{specs[0], w.data[0]}));
    ASSERT_OK((*writer)->put(TensorView{specs[1], w.data[1]}));
    if (drop) {
      writer->reset();
    } else {
      (*writer)->abort(aborted("the trainer's generator raised"));
    }
    rx.join();
    ASSERT_FALSE(got.ok());
    const std::string why = drop ? "dropped before it finished" : "the trainer's generator raised";
    EXPECT_NE(got.status().message().find(why), std::string::npos) << got.status().to_string();
    EXPECT_NE(got.status().message().find(fmt::format("tensor 2 '{}'", specs[2].name)),
              std::string::npos)
        << got.status().to_string();
    EXPECT_FALSE(sender_->update_manifest().has_value());
    join();  // the session broke: a new one, staged again
    ASSERT_OK(update(make_weights(specs, 3)).first);
  }
}

// A producer whose copies land only at the flush, as a device's asynchronous D2H: a writer
// that hashed or published a segment before flushing would send the bytes that were there.
struct LateCopies {
  std::vector<std::pair<std::span<std::byte>, std::span<const std::byte>>> pending;
  int flushes = 0;

  TensorProducer of(std::span<const std::byte> tensor) {
    return [this, tensor](std::uint64_t offset, std::span<std::byte> dst) {
      std::fill(dst.begin(), dst.end(), std::byte{0xEE});  // what a hasty reader would see
      pending.emplace_back(dst, tensor.subspan(offset, dst.size()));
      return ok_status();
    };
  }
  Status flush() {
    for (auto [dst, src] : pending) std::copy(src.begin(), src.end(), dst.begin());
    pending.clear();
    ++flushes;
    return ok_status();
  }
};

TEST_F(SendUpdate, ProducedTensorsAreFlushedBeforeTheyAreSentStagedAndStreamed) {
  const std::vector<TensorSpec> specs = small_model();
  LateCopies copies;
  for (std::uint64_t seed = 1; seed <= 2; ++seed) {  // staged, then streamed
    const Weights w = make_weights(specs, seed);
    Result<Received> got = aborted("not received");
    std::thread rx([&] { got = receive_update(*receiver_); });
    Sender* one = sender_.get();
    UpdateOptions options{.staging_bytes = 4096};  // the embedding is larger: sent alone
    options.flush = [&] { return copies.flush(); };
    auto writer = UpdateWriter::begin(std::span<Sender* const>(&one, 1), options);
    ASSERT_OK(writer);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      ASSERT_OK((*writer)->put(specs[i], copies.of(w.data[i])));
    }
    auto sent = (*writer)->finish();
    rx.join();
    ASSERT_OK(sent);
    ASSERT_OK(got);
    EXPECT_EQ((*sent)[0].streamed, seed == 2);
    EXPECT_GE((*sent)[0].last_round.buckets, 2u);
    expect_bit_exact(*got, w);
  }
  EXPECT_GE(copies.flushes, 4);
}

TEST_F(SendUpdate, AProducerNeedsAFlushAndItsErrorFailsTheRoundNamingTheTensor) {
  const std::vector<TensorSpec> specs = small_model();
  ASSERT_OK(update(make_weights(specs, 1)).first);  // learned: the next one streams
  const Weights w = make_weights(specs, 2);
  Sender* one = sender_.get();
  {
    auto writer = UpdateWriter::begin(std::span<Sender* const>(&one, 1));  // no flush
    ASSERT_OK(writer);
    const TensorProducer copy = [&](std::uint64_t, std::span<std::byte>) { return ok_status(); };
    EXPECT_EQ((*writer)->put(specs[0], copy).code(), Code::kInvalidArgument);
    (*writer)->abort(aborted("no flush"));  // nothing went out: the session is intact
  }
  Result<Received> got = aborted("not received");
  std::thread rx([&] { got = receive_update(*receiver_); });
  UpdateOptions options;
  options.flush = [] { return ok_status(); };
  auto writer = UpdateWriter::begin(std::span<Sender* const>(&one, 1), options);
  ASSERT_OK(writer);
  ASSERT_OK((*writer)->put(TensorView{specs[0], w.data[0]}));
  const TensorProducer failing = [](std::uint64_t, std::span<std::byte>) {
    return io_error("the device copy failed");
  };
  const Status s = (*writer)->put(specs[1], failing);
  rx.join();
  EXPECT_EQ(s.code(), Code::kIoError) << s.to_string();
  EXPECT_NE(s.message().find(fmt::format("tensor 1 '{}': the device copy failed", specs[1].name)),
            std::string::npos)
      << s.to_string();
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("the device copy failed"), std::string::npos)
      << got.status().to_string();
}

// Staged (the first update): the producer writes into the staging buffer, or, for a tensor
// larger than it, a buffer of its own; either error names the tensor as a streamed one does.
TEST_F(SendUpdate, AProducersErrorInAStagedUpdateNamesTheTensor) {
  const std::vector<TensorSpec> specs = small_model();  // specs[0], the embedding: 9 KB
  for (const std::uint64_t staging : {std::uint64_t{64} << 10, std::uint64_t{4096}}) {
    SCOPED_TRACE(staging);
    Sender* one = sender_.get();
    UpdateOptions options{.staging_bytes = staging};
    options.flush = [] { return ok_status(); };
    auto writer = UpdateWriter::begin(std::span<Sender* const>(&one, 1), options);
    ASSERT_OK(writer);
    const TensorProducer failing = [](std::uint64_t, std::span<std::byte>) {
      return io_error("the device copy failed");
    };
    const Status s = (*writer)->put(specs[0], failing);
    EXPECT_EQ(s.code(), Code::kIoError) << s.to_string();
    EXPECT_NE(s.message().find(fmt::format("tensor 0 '{}': the device copy failed", specs[0].name)),
              std::string::npos)
        << s.to_string();
  }
}

TEST(UpdateWriterSender, ASenderDestroyedMidUpdateAbortsIt) {
  const SyncOptions o = tiny_options();
  const std::string address = unique_address();
  auto s = Sender::create(address, o);
  ASSERT_OK(s);
  std::unique_ptr<Receiver> receiver;
  std::thread t([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    receiver = std::move(*r);
  });
  ASSERT_OK((*s)->accept(1));
  t.join();
  const std::vector<TensorSpec> specs = small_model();
  const Weights w = make_weights(specs, 1);
  Sender* one = s->get();
  auto writer = UpdateWriter::begin(std::span<Sender* const>(&one, 1));
  ASSERT_OK(writer);
  ASSERT_OK((*writer)->put(TensorView{specs[0], w.data[0]}));  // staged: nothing sent yet
  s->reset();
  const Status after = (*writer)->put(TensorView{specs[1], w.data[1]});
  EXPECT_EQ(after.code(), Code::kFailedPrecondition);
  EXPECT_NE(after.message().find("closed before it ended"), std::string::npos) << after.to_string();
}

TEST(SendUpdateToSeveral, OneStreamFeedsEverySenderBitExact) {
  const SyncOptions o = tiny_options();
  const std::vector<std::string> addresses{unique_address(), unique_address()};
  std::vector<std::unique_ptr<Sender>> senders;
  std::vector<std::unique_ptr<Receiver>> receivers(2);
  for (int k = 0; k < 2; ++k) {
    auto s = Sender::create(addresses[k], o);
    ASSERT_OK(s);
    senders.push_back(std::move(*s));
    std::thread t([&, k] {
      auto r = Receiver::connect(addresses[k], 0, o);
      ASSERT_OK(r);
      receivers[k] = std::move(*r);
    });
    ASSERT_OK(senders[k]->accept(1));
    t.join();
  }
  Sender* both[] = {senders[0].get(), senders[1].get()};
  const std::vector<TensorSpec> specs = small_model();
  for (std::uint64_t seed = 1; seed <= 2; ++seed) {
    const Weights w = make_weights(specs, seed);
    std::vector<Result<Received>> got(2, aborted("not received"));
    std::vector<std::thread> rx;
    for (int k = 0; k < 2; ++k) rx.emplace_back([&, k] { got[k] = receive_update(*receivers[k]); });
    int pulls = 0;
    const UpdateStream counted = [&, inner = stream_of(w)] {
      ++pulls;
      return inner();
    };
    auto sent = Sender::send_update(both, counted);
    for (std::thread& t : rx) t.join();
    ASSERT_OK(sent);
    ASSERT_EQ(sent->size(), 2u);
    EXPECT_EQ(pulls, static_cast<int>(specs.size()) + 1);  // each tensor once, then the end
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ((*sent)[k].streamed, seed == 2);
      ASSERT_OK(got[k]);
      expect_bit_exact(*got[k], w);
    }
  }
  EXPECT_EQ(Sender::send_update(std::span<Sender* const>(), stream_of(make_weights(specs, 3)))
                .status()
                .code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::sync

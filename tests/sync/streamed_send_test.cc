// UpdateWriter::begin_round: one round streamed against a manifest, each tensor pushed in
// manifest order and copied straight into the ring before put() returns; a tensor of the
// wrong size, one too many or too few, or the caller's abort fails the round by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/status_macros.h"
#include "support/status_matchers.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::small_model;
using testing::tiny_options;
using testing::unique_address;
using testing::Weights;

// Receives rounds into fresh destinations of `specs` in a thread; keeps each round's status.
struct DestinationReceiver {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::byte>> data;
  std::vector<Status> statuses;
  std::thread thread;

  DestinationReceiver(const std::string& address, const std::vector<TensorSpec>& s, int rounds)
      : specs(s) {
    for (const auto& t : specs) data.emplace_back(t.bytes(), std::byte{0});
    thread = std::thread([this, address, rounds] {
      auto r = Receiver::connect(address, 0, tiny_options());
      ASSERT_OK(r);
      for (std::size_t i = 0; i < specs.size(); ++i) {
        ASSERT_OK((*r)->set_destination({specs[i], data[i]}));
      }
      for (int round = 0; round < rounds; ++round) {
        statuses.push_back((*r)->receive_round_into().status());
        if (!statuses.back().ok()) return;
      }
    });
  }
  ~DestinationReceiver() {
    if (thread.joinable()) thread.join();
  }
};

// One round to `sender` streamed against `specs` (UpdateWriter::begin_round).
Result<std::unique_ptr<UpdateWriter>> begin_round(Sender& sender,
                                                  const std::vector<TensorSpec>& specs) {
  return UpdateWriter::begin_round(&sender, specs);
}

TEST(SyncStreamed, EachTensorIsCopiedBeforePutReturnsAndEveryByteArrives) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  ASSERT_OK(sender);
  DestinationReceiver rx(address, small_model(), 2);
  ASSERT_OK((*sender)->accept(1));
  for (std::uint64_t round = 1; round <= 2; ++round) {
    const Weights w = make_weights(small_model(), round);
    auto writer = begin_round(**sender, w.specs);
    ASSERT_OK(writer);
    // One buffer refilled for every tensor, as verl's generators refill their staging
    // buffer: correct only if tensor i was packed before put returned.
    std::vector<std::byte> buffer;
    for (std::size_t i = 0; i < w.specs.size(); ++i) {
      buffer.assign(w.data[i].begin(), w.data[i].end());  // may be empty
      ASSERT_OK((*writer)->put(TensorView{w.specs[i], buffer}));
      std::fill(buffer.begin(), buffer.end(), std::byte{0xee});
    }
    auto stats = (*writer)->finish();
    ASSERT_OK(stats);
    EXPECT_EQ((*stats)[0].last_round.tensors, w.specs.size());
    EXPECT_TRUE((*stats)[0].streamed);
    if (round == 2) {
      rx.thread.join();
      for (std::size_t i = 0; i < w.specs.size(); ++i) {
        EXPECT_EQ(rx.data[i], w.data[i]) << w.specs[i].name;
      }
    }
  }
  ASSERT_EQ(rx.statuses.size(), 2u);
  EXPECT_OK(rx.statuses[0]);
  EXPECT_OK(rx.statuses[1]);
}

// Streams small_model() through `push` (its puts and finish; it returns the first error);
// returns the sender's status and the receiver's.
std::pair<Status, Status> stream_one_round(const std::function<Status(UpdateWriter&)>& push) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  EXPECT_OK(sender);
  if (!sender.ok()) return {sender.status(), Status()};
  DestinationReceiver rx(address, small_model(), 1);
  Status accepted = (*sender)->accept(1);
  EXPECT_OK(accepted);
  auto writer = begin_round(**sender, small_model());
  EXPECT_OK(writer);
  if (!writer.ok()) return {writer.status(), Status()};
  Status sent = push(**writer);
  rx.thread.join();
  // The failed round broke the session, as any failed round does.
  EXPECT_EQ(begin_round(**sender, small_model()).status().code(), Code::kFailedPrecondition);
  return {sent, rx.statuses.empty() ? Status() : rx.statuses.back()};
}

TEST(SyncStreamed, ATensorOfTheWrongSizeAbortsTheRoundNamingIt) {
  const Weights w = make_weights(small_model(), 7);
  auto [sent, received] = stream_one_round([&](UpdateWriter& writer) -> Status {
    for (std::size_t i = 0; i < w.specs.size(); ++i) {
      std::span<const std::byte> bytes = w.data[i];
      if (i == 5) bytes = bytes.first(bytes.size() - 8);  // model.norm.weight, short
      FERRY_RETURN_IF_ERROR(writer.put(TensorView{w.specs[i], bytes}));
    }
    return writer.finish().status();
  });
  EXPECT_EQ(sent.code(), Code::kInvalidArgument) << sent.to_string();
  EXPECT_NE(sent.message().find("tensor 5 'model.norm.weight'"), std::string::npos)
      << sent.message();
  EXPECT_NE(sent.message().find("112 bytes given"), std::string::npos) << sent.message();
  EXPECT_FALSE(received.ok());  // told, never delivered as a whole round
}

TEST(SyncStreamed, AnAbortTellsTheReceiverWhyAndWhichTensorWasNext) {
  const Weights w = make_weights(small_model(), 8);
  auto [sent, received] = stream_one_round([&](UpdateWriter& writer) -> Status {
    for (std::size_t i = 0; i < 3; ++i) {
      FERRY_RETURN_IF_ERROR(writer.put(TensorView{w.specs[i], w.data[i]}));
    }
    const Status raised = aborted("the generator raised ValueError: boom");
    writer.abort(raised);
    return raised;
  });
  EXPECT_EQ(sent.code(), Code::kAborted) << sent.to_string();
  EXPECT_EQ(received.code(), Code::kAborted) << received.to_string();
  EXPECT_NE(received.message().find("tensor 3 'model.layers.0.packed'"), std::string::npos)
      << received.message();
  EXPECT_NE(received.message().find("ValueError: boom"), std::string::npos) << received.message();
}

TEST(SyncStreamed, MoreTensorsThanTheManifestAbortTheRound) {
  const Weights w = make_weights(small_model(), 9);
  auto [sent, received] = stream_one_round([&](UpdateWriter& writer) -> Status {
    for (std::size_t i = 0; i <= w.specs.size(); ++i) {
      const std::size_t k = i % w.specs.size();
      FERRY_RETURN_IF_ERROR(writer.put(TensorView{w.specs[k], w.data[k]}));
    }
    return writer.finish().status();
  });
  EXPECT_EQ(sent.code(), Code::kInvalidArgument) << sent.to_string();
  EXPECT_NE(sent.message().find("is one more than the 7 of the manifest"), std::string::npos)
      << sent.message();
  EXPECT_FALSE(received.ok());
}

TEST(SyncStreamed, FewerTensorsThanTheManifestFailAtFinishNamingTheFirstMissing) {
  const Weights w = make_weights(small_model(), 10);
  auto [sent, received] = stream_one_round([&](UpdateWriter& writer) -> Status {
    for (std::size_t i = 0; i + 1 < w.specs.size(); ++i) {
      FERRY_RETURN_IF_ERROR(writer.put(TensorView{w.specs[i], w.data[i]}));
    }
    return writer.finish().status();
  });
  EXPECT_EQ(sent.code(), Code::kInvalidArgument) << sent.to_string();
  EXPECT_NE(sent.message().find("ended before tensor 6 'lm_head.weight'"), std::string::npos)
      << sent.message();
  EXPECT_FALSE(received.ok());
}

TEST(SyncStreamed, AManifestNamingATensorTwiceIsRefusedBeforeAnythingIsSent) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  ASSERT_OK(sender);
  DestinationReceiver rx(address, small_model(), 1);
  ASSERT_OK((*sender)->accept(1));
  std::vector<TensorSpec> twice = small_model();
  twice.push_back(twice[2]);
  EXPECT_EQ(begin_round(**sender, twice).status().code(), Code::kInvalidArgument);
  // The session is intact: the round with the right manifest goes through.
  const Weights w = make_weights(small_model(), 11);
  auto writer = begin_round(**sender, w.specs);
  ASSERT_OK(writer);
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    ASSERT_OK((*writer)->put(TensorView{w.specs[i], w.data[i]}));
  }
  ASSERT_OK((*writer)->finish());
  rx.thread.join();
  ASSERT_EQ(rx.statuses.size(), 1u);
  EXPECT_OK(rx.statuses[0]);
}

}  // namespace
}  // namespace ferry::sync

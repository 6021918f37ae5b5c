// Sender::send_round_streamed: tensors pulled one at a time, in manifest order, straight
// into the ring; a producer that errs or gives the wrong bytes aborts the round by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "support/status_matchers.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::small_model;
using testing::tiny_options;
using testing::unique_address;
using testing::Weights;

// Gives each tensor's bytes from one buffer that it refills on every call, as verl's
// generators refill their staging buffer: correct only if tensor i is packed before
// tensor i + 1 is asked for. Records the indices it was asked for.
struct ReusedBufferStream {
  const Weights& weights;
  std::vector<std::byte> buffer;
  std::vector<std::size_t> asked;

  Result<std::span<const std::byte>> operator()(std::size_t i) {
    asked.push_back(i);
    if (i == weights.specs.size()) return std::span<const std::byte>();
    std::fill(buffer.begin(), buffer.end(), std::byte{0xee});  // the last tensor's bytes go
    buffer.resize(weights.data[i].size());
    std::copy(weights.data[i].begin(), weights.data[i].end(), buffer.begin());  // may be empty
    return std::span<const std::byte>(buffer);
  }
};

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

TEST(SyncStreamed, PullsEachTensorOnceInOrderAndDeliversEveryByte) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  ASSERT_OK(sender);
  DestinationReceiver rx(address, small_model(), 2);
  ASSERT_OK((*sender)->accept(1));
  for (std::uint64_t round = 1; round <= 2; ++round) {
    const Weights w = make_weights(small_model(), round);
    ReusedBufferStream stream{w, {}, {}};
    const TensorStream next = std::ref(stream);
    auto stats = (*sender)->send_round_streamed(w.specs, next);
    ASSERT_OK(stats);
    EXPECT_EQ(stats->tensors, w.specs.size());
    std::vector<std::size_t> in_order(w.specs.size() + 1);
    for (std::size_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
    EXPECT_EQ(stream.asked, in_order);  // the empty tensor too, then the end of the stream
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

// Streams small_model() with `next`; returns the sender's status and the receiver's.
std::pair<Status, Status> stream_one_round(const TensorStream& next) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  EXPECT_OK(sender);
  if (!sender.ok()) return {sender.status(), Status()};
  DestinationReceiver rx(address, small_model(), 1);
  Status accepted = (*sender)->accept(1);
  EXPECT_OK(accepted);
  Status sent = (*sender)->send_round_streamed(small_model(), next).status();
  rx.thread.join();
  // The failed round broke the session, as any failed round does.
  EXPECT_EQ((*sender)->send_round_streamed(small_model(), next).status().code(),
            Code::kFailedPrecondition);
  return {sent, rx.statuses.empty() ? Status() : rx.statuses.back()};
}

TEST(SyncStreamed, ATensorOfTheWrongSizeAbortsTheRoundNamingIt) {
  const Weights w = make_weights(small_model(), 7);
  const TensorStream next = [&](std::size_t i) -> Result<std::span<const std::byte>> {
    if (i == w.specs.size()) return std::span<const std::byte>();
    std::span<const std::byte> bytes = w.data[i];
    return i == 5 ? bytes.first(bytes.size() - 8) : bytes;  // model.norm.weight, short
  };
  auto [sent, received] = stream_one_round(next);
  EXPECT_EQ(sent.code(), Code::kInvalidArgument) << sent.to_string();
  EXPECT_NE(sent.message().find("tensor 5 'model.norm.weight'"), std::string::npos)
      << sent.message();
  EXPECT_NE(sent.message().find("112 bytes given"), std::string::npos) << sent.message();
  EXPECT_FALSE(received.ok());  // told, never delivered as a whole round
}

TEST(SyncStreamed, AProducerErrorAbortsTheRoundWithItsCodeAndTheTensorName) {
  const Weights w = make_weights(small_model(), 8);
  const TensorStream next = [&](std::size_t i) -> Result<std::span<const std::byte>> {
    if (i == 3) return aborted("the generator raised ValueError: boom");
    if (i == w.specs.size()) return std::span<const std::byte>();
    return std::span<const std::byte>(w.data[i]);
  };
  auto [sent, received] = stream_one_round(next);
  EXPECT_EQ(sent.code(), Code::kAborted) << sent.to_string();
  EXPECT_NE(sent.message().find("tensor 3 'model.layers.0.packed'"), std::string::npos)
      << sent.message();
  EXPECT_NE(sent.message().find("ValueError: boom"), std::string::npos) << sent.message();
  EXPECT_FALSE(received.ok());
}

TEST(SyncStreamed, AStreamWithMoreTensorsThanTheManifestAbortsTheRound) {
  const Weights w = make_weights(small_model(), 9);
  const TensorStream next = [&](std::size_t i) -> Result<std::span<const std::byte>> {
    return std::span<const std::byte>(w.data[i % w.specs.size()]);  // never ends
  };
  auto [sent, received] = stream_one_round(next);
  EXPECT_EQ(sent.code(), Code::kInvalidArgument) << sent.to_string();
  EXPECT_NE(sent.message().find("more than the 7 tensors"), std::string::npos) << sent.message();
  EXPECT_FALSE(received.ok());
}

}  // namespace
}  // namespace ferry::sync

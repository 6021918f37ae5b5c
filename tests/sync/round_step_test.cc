// RoundOptions::step: the caller's step (verl's global_steps) travels in BEGIN, comes back as
// every side's RoundStats::step and a BeginCheck's RoundBegin::step, and a receiver refuses a
// round whose step is below the last step it received (a stale trainer) before delivering
// any of it. A round without a step is not checked and leaves the minimum as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/net_test_util.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::small_model;
using testing::tiny_options;
using testing::unique_address;
using testing::Weights;

using Step = std::optional<std::uint64_t>;

// What a receiver saw of each round: the step at BEGIN (its BeginCheck) and in its stats.
struct Seen {
  Step at_begin;
  Step in_stats;
};

// Joins `address` and receives rounds until one fails or `rounds` were received.
struct StepReceiver {
  std::vector<Seen> seen;
  std::size_t delivered = 0;  // tensors, over all rounds
  Status ended;
  std::thread thread;

  StepReceiver(const std::string& address, int rounds) {
    thread = std::thread([this, address, rounds] {
      auto r = Receiver::connect(address, 0, tiny_options());
      ASSERT_OK(r);
      (*r)->set_begin_check([this](const RoundBegin& b) {
        seen.push_back(Seen{b.step, std::nullopt});
        return ok_status();
      });
      for (int i = 0; i < rounds; ++i) {
        auto stats = (*r)->receive_round([this](const TensorView&) {
          ++delivered;
          return ok_status();
        });
        if (!stats.ok()) {
          ended = stats.status();
          return;
        }
        seen.back().in_stats = stats->step;
      }
    });
  }
  ~StepReceiver() {
    if (thread.joinable()) thread.join();
  }
};

Result<RoundStats> send(Sender& sender, const Weights& w, Step step, bool more_follows = false) {
  const std::vector<TensorView> views = w.views();
  return sender.send_round(views, RoundOptions{.more_follows = more_follows, .step = step});
}

TEST(RoundStep, TravelsInBeginToTheReceiverAndBothSidesStats) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  ASSERT_OK(sender);
  const std::vector<Step> steps = {Step(0), Step(5), Step(5), Step(), Step(UINT64_MAX)};
  StepReceiver rx(address, static_cast<int>(steps.size()));
  ASSERT_OK((*sender)->accept(1));
  const Weights w = make_weights(small_model(), 1);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    // Rounds 2 and 3 are one update's two rounds: both carry its step.
    auto stats = send(**sender, w, steps[i], /*more_follows=*/i == 1);
    ASSERT_OK(stats);
    EXPECT_EQ(stats->step, steps[i]) << "round " << i + 1;
    EXPECT_EQ(stats->version, i + 1) << "the round number is not the step";
  }
  rx.thread.join();
  EXPECT_OK(rx.ended);
  ASSERT_EQ(rx.seen.size(), steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(rx.seen[i].at_begin, steps[i]) << "RoundBegin::step of round " << i + 1;
    EXPECT_EQ(rx.seen[i].in_stats, steps[i]) << "RoundStats::step of round " << i + 1;
  }
}

TEST(RoundStep, AReceiverRefusesAStepBelowTheLastItReceivedBeforeDeliveringAnything) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  ASSERT_OK(sender);
  StepReceiver rx(address, 5);
  ASSERT_OK((*sender)->accept(1));
  const Weights w = make_weights(small_model(), 1);
  ASSERT_OK(send(**sender, w, Step(3)));
  ASSERT_OK(send(**sender, w, Step(4)));
  ASSERT_OK(send(**sender, w, Step(4)));  // the same step again (a resent update) passes
  ASSERT_OK(send(**sender, w, Step()));   // a round without a step is not checked
  auto stale = send(**sender, w, Step(2));
  rx.thread.join();
  // The receiver names both steps; the sender fails with its reason (and code).
  ASSERT_FALSE(rx.ended.ok());
  EXPECT_EQ(rx.ended.code(), Code::kFailedPrecondition) << rx.ended.to_string();
  const std::string& m = rx.ended.message();
  EXPECT_NE(m.find("round 5"), std::string::npos) << m;
  EXPECT_NE(m.find("stale weights"), std::string::npos) << m;
  EXPECT_NE(m.find("step 2"), std::string::npos) << m;
  EXPECT_NE(m.find("step 4"), std::string::npos) << m;
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), Code::kFailedPrecondition) << stale.status().to_string();
  EXPECT_NE(stale.status().message().find("receiver 0"), std::string::npos)
      << stale.status().message();
  EXPECT_NE(stale.status().message().find("stale weights"), std::string::npos)
      << stale.status().message();
  // Refused before the caller's BeginCheck, and before any tensor of it was delivered.
  EXPECT_EQ(rx.seen.size(), 4u);
  EXPECT_EQ(rx.delivered, 4 * small_model().size());
}

TEST(RoundStep, ARoundWithoutAStepPassesAndLeavesTheMinimumAlone) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  ASSERT_OK(sender);
  StepReceiver rx(address, 3);
  ASSERT_OK((*sender)->accept(1));
  const Weights w = make_weights(small_model(), 1);
  ASSERT_OK(send(**sender, w, Step(4)));
  ASSERT_OK(send(**sender, w, Step()));
  EXPECT_FALSE(send(**sender, w, Step(3)).ok());
  rx.thread.join();
  EXPECT_EQ(rx.ended.code(), Code::kFailedPrecondition) << rx.ended.to_string();
  EXPECT_NE(rx.ended.message().find("step 3"), std::string::npos) << rx.ended.message();
  EXPECT_NE(rx.ended.message().find("step 4"), std::string::npos) << rx.ended.message();
}

// A relay forwards BEGIN byte for byte: its local receivers see the sender's step, and the
// relay's own RoundStats say it too.
TEST(RoundStep, CrossesARelayToItsLocalReceivers) {
  ferry::testing::TempDir dir;
  const SyncOptions o = testing::net_options(dir);
  auto sender = Sender::create("127.0.0.1:0", o);
  ASSERT_OK(sender);
  const std::string local = unique_address();
  const std::vector<Step> steps = {Step(9), Step()};
  std::vector<Step> relayed, received;
  std::thread relay_thread([&] {
    auto relay = Relay::connect((*sender)->address(), 0, local, o);
    ASSERT_OK(relay);
    ASSERT_OK((*relay)->accept(1));
    for (std::size_t i = 0; i < steps.size(); ++i) {
      auto stats = (*relay)->relay_round();
      ASSERT_OK(stats);
      relayed.push_back(stats->step);
    }
  });
  std::thread rx([&] {
    auto r = Receiver::connect(local, 0, o);
    ASSERT_OK(r);
    for (std::size_t i = 0; i < steps.size(); ++i) {
      auto stats = (*r)->receive_round([](const TensorView&) { return ok_status(); });
      ASSERT_OK(stats);
      received.push_back(stats->step);
    }
  });
  ASSERT_OK((*sender)->accept(1));
  const Weights w = make_weights(small_model(), 1);
  for (const Step& step : steps) ASSERT_OK(send(**sender, w, step));
  relay_thread.join();
  rx.join();
  EXPECT_EQ(relayed, steps);
  EXPECT_EQ(received, steps);
}

// A caller's minimum (Receiver::set_min_step): the rollout that waits for a step, or that
// received a newer one in an earlier session.
TEST(RoundStep, SetMinStepRefusesAnOlderStepFromTheFirstRound) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  ASSERT_OK(sender);
  Status ended;
  std::size_t delivered = 0;
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, tiny_options());
    ASSERT_OK(r);
    (*r)->set_min_step(6);
    (*r)->set_min_step(5);  // never lowers it
    for (int i = 0; i < 3 && ended.ok(); ++i) {
      ended = (*r)->receive_round([&](const TensorView&) {
                    ++delivered;
                    return ok_status();
                  })
                  .status();
    }
  });
  ASSERT_OK((*sender)->accept(1));
  const Weights w = make_weights(small_model(), 1);
  ASSERT_OK(send(**sender, w, Step()));  // no step: not checked
  ASSERT_OK(send(**sender, w, Step(6)));
  const std::size_t before = small_model().size() * 2;
  EXPECT_FALSE(send(**sender, w, Step(5)).ok());
  rx.join();
  EXPECT_EQ(ended.code(), Code::kFailedPrecondition) << ended.to_string();
  EXPECT_NE(
      ended.message().find("the sender sends step 5, but this receiver has or requires step 6"),
      std::string::npos)
      << ended.message();
  EXPECT_EQ(delivered, before);
}

}  // namespace
}  // namespace ferry::sync

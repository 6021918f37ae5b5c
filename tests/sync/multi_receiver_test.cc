// Several senders, each serving a disjoint part of a model, and one MultiReceiver that
// assembles the union: every byte over several rounds in both delivery modes, over shm and
// the net transport, and the rules (disjoint names, updates split alike, any failure fails
// all).
#include "ferry/multi_receiver.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "base/clock.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "ferry/sender_parts.h"
#include "support/status_matchers.h"
#include "support/test_support.h"
#include "sync/net_test_util.h"
#include "sync/sync_test_util.h"
#include "sync/testing.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::net_options;
using testing::small_model;
using testing::tiny_options;
using testing::unique_address;
using testing::Weights;

// The weights of round r: seed r, the same for every sender, so each can serve its part.
Weights round_weights(const std::vector<TensorSpec>& model, int round) {
  return make_weights(model, static_cast<std::uint64_t>(round));
}

// The views of part `indices` of `w`.
std::vector<TensorView> part_views(const Weights& w, const std::vector<std::size_t>& indices) {
  std::vector<TensorView> views;
  for (std::size_t i : indices) views.push_back({w.specs[i], w.data[i]});
  return views;
}

// A Sender on its own thread serving part `indices` of the model for `rounds` rounds to one
// receiver; status() is its first error (OK when every round went through).
class PartSender {
 public:
  PartSender(std::string address, SyncOptions options, std::vector<TensorSpec> model,
             std::vector<std::size_t> indices, int rounds, RoundOptions round_options = {})
      : address_(std::move(address)) {
    auto sender = Sender::create(address_, options);
    if (!sender.ok()) {
      status_ = sender.status();
      return;
    }
    sender_ = std::move(*sender);
    address_ = sender_->address();  // a net sender's bound port
    thread_ = std::thread(
        [this, model = std::move(model), indices = std::move(indices), rounds, round_options] {
          status_ = sender_->accept(1);
          for (int r = 1; r <= rounds && status_.ok(); ++r) {
            const Weights w = round_weights(model, r);
            const std::vector<TensorView> views = part_views(w, indices);
            status_ = sender_->send_round(views, round_options).status();
          }
        });
  }
  ~PartSender() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  const std::string& address() const { return address_; }
  Status status() {
    join();
    return status_;
  }

 private:
  std::string address_;
  std::unique_ptr<Sender> sender_;
  Status status_;
  std::thread thread_;
};

// Destinations for every tensor of `model`, filled with a byte no round sends everywhere.
struct Destinations {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::byte>> data;
  explicit Destinations(const std::vector<TensorSpec>& model) : specs(model) {
    for (const TensorSpec& t : model) data.emplace_back(t.bytes(), std::byte{0x5a});
  }
  Status register_all(MultiReceiver& rx) {
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (Status s = rx.set_destination({specs[i], data[i]}); !s.ok()) return s;
    }
    return ok_status();
  }
};

std::vector<std::unique_ptr<PartSender>> start_senders(
    const std::vector<TensorSpec>& model, std::uint32_t senders, const SyncOptions& options,
    int rounds, const std::function<std::string()>& next_address) {
  auto parts = split_into_parts(model, senders);
  EXPECT_OK(parts);
  std::vector<std::unique_ptr<PartSender>> out;
  for (std::uint32_t k = 0; k < senders; ++k) {
    out.push_back(
        std::make_unique<PartSender>(next_address(), options, model, (*parts)[k], rounds));
  }
  return out;
}

std::vector<std::string> addresses_of(const std::vector<std::unique_ptr<PartSender>>& senders) {
  std::vector<std::string> out;
  for (const auto& s : senders) out.push_back(s->address());
  return out;
}

// N senders, 3 rounds, destination mode then callback mode: every tensor bit-exact each round.
// With options.delta on, rounds after the first must be delta rounds.
void expect_every_byte_from(std::uint32_t n, const std::vector<TensorSpec>& model,
                            const SyncOptions& options,
                            const std::function<std::string()>& next_address) {
  const bool deltas = options.delta == DeltaMode::kOn;
  constexpr int kRounds = 3;
  for (const bool into_destinations : {true, false}) {
    SCOPED_TRACE(into_destinations ? "destination mode" : "callback mode");
    auto senders = start_senders(model, n, options, kRounds, next_address);
    auto rx = MultiReceiver::connect(addresses_of(senders), 0, options);
    ASSERT_OK(rx);
    Destinations dst(model);
    ASSERT_OK(dst.register_all(**rx));
    std::uint64_t model_bytes = 0;
    for (const TensorSpec& t : model) model_bytes += t.bytes();
    for (int r = 1; r <= kRounds; ++r) {
      const Weights want = round_weights(model, r);
      std::map<std::string, std::vector<std::byte>> got;
      auto stats = into_destinations ? (*rx)->receive_round_into()
                                     : (*rx)->receive_round([&](const TensorView& t) {
                                         EXPECT_EQ(got.count(t.spec.name), 0u) << t.spec.name;
                                         got[t.spec.name].assign(t.data.begin(), t.data.end());
                                         return ok_status();
                                       });
      ASSERT_OK(stats);
      EXPECT_EQ(stats->round, static_cast<std::uint64_t>(r));
      EXPECT_EQ(stats->tensors, model.size());
      EXPECT_EQ(stats->bytes, model_bytes);
      EXPECT_EQ(stats->delta, deltas && r > 1);
      ASSERT_EQ((*rx)->sender_stats().size(), n);
      for (const RoundStats& s : (*rx)->sender_stats()) EXPECT_EQ(s.round, stats->round);
      for (std::size_t i = 0; i < model.size(); ++i) {
        const auto& have = into_destinations ? dst.data[i] : got[model[i].name];
        EXPECT_TRUE(have == want.data[i]) << "round " << r << " " << model[i].name;
      }
    }
    for (auto& s : senders) EXPECT_OK(s->status());
  }
}

// Net sessions on 127.0.0.1 (testing::net_options), and a model whose embedding spans buckets.
std::vector<TensorSpec> net_model() {
  return {*TensorSpec::make("embed", DType::kBF16, {300, 512}),  // 300 KiB: spans buckets
          *TensorSpec::make("norm", DType::kF32, {37}),
          *TensorSpec::make("empty", DType::kF16, {0}),
          *TensorSpec::make("lm_head", DType::kF32, {100, 129}),
          *TensorSpec::make("layer.0", DType::kF32, {64, 64})};
}

TEST(SenderParts, SplitIsDisjointCompleteBalancedAndOrderFree) {
  std::vector<TensorSpec> model;
  for (int i = 0; i < 40; ++i) {
    model.push_back(*TensorSpec::make("t" + std::to_string(i), DType::kF32, {(i * 37) % 101 + 1}));
  }
  auto parts = split_into_parts(model, 3);
  ASSERT_OK(parts);
  ASSERT_EQ(parts->size(), 3u);
  std::vector<int> seen(model.size(), 0);
  std::vector<std::uint64_t> bytes;
  std::uint64_t largest = 0;
  for (const auto& part : *parts) {
    std::uint64_t b = 0;
    for (std::size_t i : part) {
      ++seen[i];
      b += model[i].bytes();
      largest = std::max(largest, model[i].bytes());
    }
    bytes.push_back(b);
  }
  for (int n : seen) EXPECT_EQ(n, 1);
  // Greedy by size: no part exceeds another by more than the largest tensor.
  const auto [lo, hi] = std::minmax_element(bytes.begin(), bytes.end());
  EXPECT_LE(*hi - *lo, largest);

  // Every rank computes the same split whatever order it lists the tensors in.
  std::vector<TensorSpec> reversed(model.rbegin(), model.rend());
  auto again = split_into_parts(reversed, 3);
  ASSERT_OK(again);
  for (std::size_t k = 0; k < 3; ++k) {
    std::set<std::string> a, b;
    for (std::size_t i : (*parts)[k]) a.insert(model[i].name);
    for (std::size_t i : (*again)[k]) b.insert(reversed[i].name);
    EXPECT_EQ(a, b) << "part " << k;
  }
}

TEST(SenderParts, BadSplitsAreRejectedNamingWhy) {
  const std::vector<TensorSpec> model = small_model();
  auto none = split_into_parts(model, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kInvalidArgument);
  std::vector<TensorSpec> twice = {model[0], model[1], model[0]};
  auto dup = split_into_parts(twice, 2);
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("'model.embed_tokens.weight' is given twice"),
            std::string::npos)
      << dup.status().message();
  auto more_parts = split_into_parts(model, 20);  // more parts than tensors: some are empty
  ASSERT_OK(more_parts);
  std::size_t total = 0;
  for (const auto& p : *more_parts) total += p.size();
  EXPECT_EQ(total, model.size());
}

TEST(MultiReceiver, TwoAndThreeShmSendersDeliverEveryByte) {
  // small_model's embedding spans ~37 buckets of the tiny options: a part with a tensor
  // larger than the bucket.
  for (std::uint32_t n : {2u, 3u}) {
    SCOPED_TRACE(std::to_string(n) + " senders");
    expect_every_byte_from(n, small_model(), tiny_options(), unique_address);
  }
}

TEST(MultiReceiver, DeltaRoundsFromTwoSendersDeliverEveryByte) {
  SyncOptions o = tiny_options();
  o.delta = DeltaMode::kOn;
  expect_every_byte_from(2, small_model(), o, unique_address);
}

TEST(MultiReceiver, TwoAndThreeNetSendersDeliverEveryByte) {
  ferry::testing::TempDir dir;
  const SyncOptions o = net_options(dir);
  const std::vector<TensorSpec> model = net_model();
  for (std::uint32_t n : {2u, 3u}) {
    SCOPED_TRACE(std::to_string(n) + " senders");
    expect_every_byte_from(n, model, o, [] { return std::string("127.0.0.1:0"); });
  }
}

// Senders on other nodes: each net sender feeds a relay, and the MultiReceiver joins the
// relays' local addresses, as a rollout on a receiving node would.
TEST(MultiReceiver, TwoNetSendersThroughTheirRelaysDeliverEveryByte) {
  ferry::testing::TempDir dir;
  const SyncOptions o = net_options(dir);
  const std::vector<TensorSpec> model = net_model();
  constexpr int kRounds = 2;
  auto parts = split_into_parts(model, 2);
  ASSERT_OK(parts);
  std::vector<std::unique_ptr<PartSender>> senders;
  std::vector<std::string> locals;
  std::vector<Status> relayed(2);
  std::vector<std::thread> relays;
  for (std::uint32_t k = 0; k < 2; ++k) {
    senders.push_back(std::make_unique<PartSender>("127.0.0.1:0", o, model, (*parts)[k], kRounds));
    locals.push_back(unique_address());
  }
  for (std::uint32_t k = 0; k < 2; ++k) {
    relays.emplace_back([&, k] {
      auto relay = Relay::connect(senders[k]->address(), 1, locals[k], o);
      relayed[k] = relay.status();
      if (relay.ok()) relayed[k] = (*relay)->accept(1);
      for (int r = 0; r < kRounds && relayed[k].ok(); ++r) {
        relayed[k] = (*relay)->relay_round().status();
      }
    });
  }
  auto rx = MultiReceiver::connect(locals, 0, o);
  ASSERT_OK(rx);
  Destinations dst(model);
  ASSERT_OK(dst.register_all(**rx));
  for (int r = 1; r <= kRounds; ++r) {
    ASSERT_OK((*rx)->receive_round_into());
    const Weights want = round_weights(model, r);
    for (std::size_t i = 0; i < model.size(); ++i) {
      EXPECT_TRUE(dst.data[i] == want.data[i]) << "round " << r << " " << model[i].name;
    }
  }
  for (std::thread& t : relays) t.join();
  for (const Status& s : relayed) EXPECT_OK(s);
  for (auto& s : senders) EXPECT_OK(s->status());
}

TEST(MultiReceiver, ATensorTwoSendersSendIsRefusedNamingItAndBoth) {
  const SyncOptions o = tiny_options();
  const std::vector<TensorSpec> model = small_model();
  // Both parts hold tensor 1 (and sender 1 only that). Two rounds each: a sender whose first
  // round went through before the clash was seen fails its second.
  PartSender first(unique_address(), o, model, {0, 1, 2}, 2);
  PartSender second(unique_address(), o, model, {1}, 2);
  auto rx = MultiReceiver::connect({first.address(), second.address()}, 0, o);
  ASSERT_OK(rx);
  std::map<std::string, int> delivered;
  auto stats = (*rx)->receive_round([&](const TensorView& t) {
    ++delivered[t.spec.name];
    return ok_status();
  });
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), Code::kInvalidArgument) << stats.status().to_string();
  const std::string& m = stats.status().message();
  EXPECT_NE(m.find("tensor '" + model[1].name + "' is sent by both"), std::string::npos) << m;
  EXPECT_NE(m.find(first.address()), std::string::npos) << m;
  EXPECT_NE(m.find(second.address()), std::string::npos) << m;
  EXPECT_LE(delivered[model[1].name], 1) << "the second copy was delivered";
  // Every session is over: both senders' rounds fail, and so do later calls here.
  EXPECT_FALSE(first.status().ok());
  EXPECT_FALSE(second.status().ok());
  auto later = (*rx)->receive_round_into();
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(later.status().message().find("is sent by both"), std::string::npos);
}

// After a recovery senders count their rounds differently: rounds pair in order regardless.
TEST(MultiReceiver, SendersWhoseRoundNumbersDifferArePairedInOrder) {
  const SyncOptions o = tiny_options();
  const std::vector<TensorSpec> model = small_model();
  const Weights w = round_weights(model, 1);
  // The second sender sent a round to a bystander first: its next round is its round 2.
  const std::string ahead = unique_address();
  auto early = Sender::create(ahead, o);
  ASSERT_OK(early);
  std::thread bystander([&] {
    auto r = Receiver::connect(ahead, 9, o);
    ASSERT_OK(r);
    for (int round = 0; round < 2; ++round) {
      ASSERT_OK((*r)->receive_round([](const TensorView&) { return ok_status(); }));
    }
  });
  ASSERT_OK((*early)->accept(1));
  const std::vector<std::size_t> rest = {1, 2, 3, 4, 5, 6};
  ASSERT_OK((*early)->send_round(part_views(w, rest)));
  PartSender first(unique_address(), o, model, {0}, 1);
  Status second_sent;
  std::thread second([&] {
    second_sent = (*early)->accept(1);
    if (second_sent.ok()) second_sent = (*early)->send_round(part_views(w, rest)).status();
  });
  auto rx = MultiReceiver::connect({first.address(), ahead}, 0, o);
  ASSERT_OK(rx);
  Destinations dst(model);
  ASSERT_OK(dst.register_all(**rx));
  auto stats = (*rx)->receive_round_into();
  second.join();
  bystander.join();
  ASSERT_OK(stats);
  EXPECT_OK(second_sent);
  EXPECT_OK(first.status());
  ASSERT_EQ((*rx)->sender_stats().size(), 2u);
  EXPECT_EQ((*rx)->sender_stats()[0].round, 1u);
  EXPECT_EQ((*rx)->sender_stats()[1].round, 2u);
  EXPECT_EQ(stats->round, 1u);  // the first sender's
  for (std::size_t i = 0; i < model.size(); ++i) {
    EXPECT_TRUE(dst.data[i] == w.data[i]) << model[i].name;
  }
}

// A sender that goes on after a failed round, as `ferry sync serve --keep-going` does: its
// next accept() starts a new session and it sends its next round there. Its round r carries
// round_weights(r), so what a receiver got is checked against each sender's round number.
class KeepGoingSender {
 public:
  KeepGoingSender(const SyncOptions& options, const std::vector<TensorSpec>& model,
                  std::vector<std::size_t> indices)
      : address_(unique_address()) {
    auto sender = Sender::create(address_, options);
    EXPECT_OK(sender);
    if (!sender.ok()) return;
    sender_ = std::move(*sender);
    thread_ = std::thread([this, model, indices = std::move(indices)] {
      if (!sender_->accept(1).ok()) return;
      for (int r = 1; !stop_; ++r) {
        const Weights w = round_weights(model, r);
        if (!sender_->send_round(part_views(w, indices)).ok() && !stop_) {
          if (!sender_->accept(1).ok()) return;
        }
      }
    });
  }
  ~KeepGoingSender() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  const std::string& address() const { return address_; }

 private:
  std::string address_;
  std::unique_ptr<Sender> sender_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// After one sender's round failed, the other's may have gone through, so the two count their
// rounds differently from then on; the next MultiReceiver still gets a whole round from both.
TEST(MultiReceiver, ANewMultiReceiverAfterAFailedRoundGetsEverySendersNextRound) {
  SyncOptions o = tiny_options();
  o.timeout = std::chrono::milliseconds(2'000);  // bounds the senders' last accept()
  const std::vector<TensorSpec> model = small_model();
  auto parts = split_into_parts(model, 2);
  ASSERT_OK(parts);
  std::set<std::string> part0;
  for (std::size_t i : (*parts)[0]) part0.insert(model[i].name);
  std::vector<std::unique_ptr<KeepGoingSender>> senders;
  for (std::size_t k = 0; k < 2; ++k) {
    senders.push_back(std::make_unique<KeepGoingSender>(o, model, (*parts)[k]));
  }
  const std::vector<std::string> addresses = {senders[0]->address(), senders[1]->address()};
  {
    auto rx = MultiReceiver::connect(addresses, 0, o);
    ASSERT_OK(rx);
    ASSERT_OK((*rx)->receive_round([](const TensorView&) { return ok_status(); }));
    // Round 2 fails on sender 0's side only: the rollout refuses one of its tensors.
    auto failed = (*rx)->receive_round([&](const TensorView& t) {
      return part0.count(t.spec.name) != 0 ? aborted("the rollout gave up") : ok_status();
    });
    ASSERT_FALSE(failed.ok());
    EXPECT_NE(failed.status().message().find("sender 0 (" + addresses[0] + ")"), std::string::npos)
        << failed.status().message();
  }
  auto rx = MultiReceiver::connect(addresses, 0, o);
  ASSERT_OK(rx);
  Destinations dst(model);
  ASSERT_OK(dst.register_all(**rx));
  auto stats = (*rx)->receive_round_into();
  ASSERT_OK(stats);
  ASSERT_EQ((*rx)->sender_stats().size(), 2u);
  for (std::size_t k = 0; k < 2; ++k) {
    const int round = static_cast<int>((*rx)->sender_stats()[k].round);
    EXPECT_GE(round, 3) << "sender " << k;
    const Weights want = round_weights(model, round);
    for (std::size_t i : (*parts)[k]) {
      EXPECT_TRUE(dst.data[i] == want.data[i]) << "sender " << k << " " << model[i].name;
    }
  }
}

// verl's ranks rebuild their sessions side by side: a receiver may reach sender 1's last
// session just before it closes, having joined sender 0's new one. It joins sender 1's next
// session at that address, keeping sender 0 (which would otherwise wait for it in vain).
TEST(MultiReceiver, ASessionClosingUnderTheJoinIsJoinedAgainKeepingTheOthers) {
  const SyncOptions o = tiny_options();
  const std::vector<TensorSpec> model = small_model();
  auto parts = split_into_parts(model, 2);
  ASSERT_OK(parts);
  const std::string address1 = unique_address();
  PartSender sender0(unique_address(), o, model, (*parts)[0], 1);
  auto last_session = Sender::create(address1, o);  // up, not accepting
  ASSERT_OK(last_session);
  std::unique_ptr<PartSender> sender1;
  std::thread rebuild([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    last_session->reset();
    sender1 = std::make_unique<PartSender>(address1, o, model, (*parts)[1], 1);
  });
  auto rx = MultiReceiver::connect({sender0.address(), address1}, 0, o);
  rebuild.join();
  ASSERT_OK(rx);
  Destinations dst(model);
  ASSERT_OK(dst.register_all(**rx));
  ASSERT_OK((*rx)->receive_round_into());
  const Weights want = round_weights(model, 1);
  for (std::size_t i = 0; i < model.size(); ++i) {
    EXPECT_TRUE(dst.data[i] == want.data[i]) << model[i].name;
  }
  EXPECT_OK(sender0.status());
  EXPECT_OK(sender1->status());
}

TEST(MultiReceiver, AnUpdateSplitIntoDifferentRoundsIsRefusedNamingBoth) {
  const SyncOptions o = tiny_options();
  const std::vector<TensorSpec> model = small_model();
  const Weights w = round_weights(model, 1);
  const std::string split = unique_address();
  auto sender = Sender::create(split, o);
  ASSERT_OK(sender);
  std::thread serve([&] {
    if (!(*sender)->accept(1).ok()) return;
    (void)(*sender)->send_round(part_views(w, {0}), RoundOptions{.more_follows = true});
  });
  PartSender whole(unique_address(), o, model, {1, 2}, 1);
  auto rx = MultiReceiver::connect({split, whole.address()}, 0, o);
  ASSERT_OK(rx);
  auto stats = (*rx)->receive_round([](const TensorView&) { return ok_status(); });
  serve.join();
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), Code::kFailedPrecondition) << stats.status().to_string();
  const std::string& m = stats.status().message();
  EXPECT_NE(m.find("sender 0 (" + split + ") (its round 1) says more rounds of the update follow"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("sender 1 (" + whole.address() + ")"), std::string::npos) << m;
}

// The senders of one update carry the trainer's same step; the receiver reports it.
TEST(MultiReceiver, SendersAgreeOnTheStepOrTheRoundIsRefusedNamingBoth) {
  const SyncOptions o = tiny_options();
  const std::vector<TensorSpec> model = small_model();
  for (const std::uint64_t second_step : {5u, 6u}) {
    PartSender a(unique_address(), o, model, {0, 1}, 1, RoundOptions{.step = 5});
    PartSender b(unique_address(), o, model, {2, 3, 4, 5, 6}, 1, RoundOptions{.step = second_step});
    auto rx = MultiReceiver::connect({a.address(), b.address()}, 0, o);
    ASSERT_OK(rx);
    auto stats = (*rx)->receive_round([](const TensorView&) { return ok_status(); });
    if (second_step == 5) {
      ASSERT_OK(stats);
      EXPECT_EQ(stats->step, 5u);
      continue;
    }
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), Code::kFailedPrecondition) << stats.status().to_string();
    const std::string& m = stats.status().message();
    EXPECT_NE(m.find("step 5"), std::string::npos) << m;
    EXPECT_NE(m.find("step 6"), std::string::npos) << m;
    EXPECT_NE(m.find(a.address()), std::string::npos) << m;
    EXPECT_NE(m.find(b.address()), std::string::npos) << m;
  }
}

TEST(MultiReceiver, ASenderFailingMidRoundFailsTheRoundNamingIt) {
  const SyncOptions o = tiny_options();
  const std::vector<TensorSpec> model = small_model();
  auto parts = split_into_parts(model, 2);
  ASSERT_OK(parts);
  PartSender healthy(unique_address(), o, model, (*parts)[1], 2);
  const std::string failing = unique_address();
  auto sender = Sender::create(failing, o);
  ASSERT_OK(sender);
  std::thread serve([&] {
    if (!(*sender)->accept(1).ok()) return;
    const Weights w = round_weights(model, 1);
    const std::vector<TensorView> views = part_views(w, (*parts)[0]);
    std::vector<TensorSpec> specs;
    for (const TensorView& v : views) specs.push_back(v.spec);
    // The producer fails after the first tensor (the embedding, many buckets) went out.
    auto writer = UpdateWriter::begin_round(sender->get(), specs);
    if (!writer.ok() || !(*writer)->put(views[0]).ok()) return;
    (*writer)->abort(io_error("the trainer's copy failed"));
  });
  auto rx = MultiReceiver::connect({failing, healthy.address()}, 0, o);
  ASSERT_OK(rx);
  Destinations dst(model);
  ASSERT_OK(dst.register_all(**rx));
  auto stats = (*rx)->receive_round_into();
  serve.join();
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("sender 0 (" + failing + ")"), std::string::npos)
      << stats.status().message();
  EXPECT_EQ(stats.status().message().find("sender 1"), std::string::npos)
      << "the healthy sender is blamed: " << stats.status().message();
  // The healthy sender's session is broken too: its two rounds do not both go through.
  EXPECT_FALSE(healthy.status().ok());
}

TEST(MultiReceiver, ASenderKilledMidRoundFailsTheRoundAtOnceNamingIt) {
  SyncOptions o = tiny_options();
  o.timeout = std::chrono::milliseconds(30'000);  // EOF must win long before this
  const std::vector<TensorSpec> model = small_model();
  auto parts = split_into_parts(model, 2);
  ASSERT_OK(parts);
  const std::string doomed = unique_address();
  // Forked before any thread starts: the child kills itself at bucket 5 of its part.
  auto child = Subprocess::fork(
      [&](int) {
        auto s = Sender::create(doomed, o);
        if (!s.ok() || !(*s)->accept(1).ok()) return 10;
        testing::ScopedCorruptSlotHook kill_at_bucket_5([](std::uint32_t bucket, std::byte*) {
          if (bucket == 5) ::kill(::getpid(), SIGKILL);
        });
        const Weights w = round_weights(model, 1);
        (void)(*s)->send_round(part_views(w, (*parts)[0]));
        return 12;
      },
      "doomed sender");
  ASSERT_OK(child);
  PartSender healthy(unique_address(), o, model, (*parts)[1], 2);
  auto rx = MultiReceiver::connect({healthy.address(), doomed}, 0, o);
  ASSERT_OK(rx);
  Destinations dst(model);
  ASSERT_OK(dst.register_all(**rx));
  const auto start = Clock::now();
  auto stats = (*rx)->receive_round_into();
  const auto took = Clock::now() - start;
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), Code::kAborted) << stats.status().to_string();
  EXPECT_NE(stats.status().message().find("sender 1 (" + doomed + ")"), std::string::npos)
      << stats.status().message();
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_FALSE(healthy.status().ok());
  const auto exit = child->wait(Deadline(std::chrono::milliseconds(10'000)));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
}

// Serves part `part` of two updates, each one last round: the first whole, the second streamed
// and, at the stream's end (its last bucket sent, its END not), `at_end` decides how it goes.
Status serve_two_updates_failing_at_the_end(const std::string& address, const SyncOptions& o,
                                            const std::vector<TensorSpec>& model,
                                            const std::vector<std::size_t>& part,
                                            const std::function<Status()>& at_end) {
  auto sender = Sender::create(address, o);
  if (!sender.ok()) return sender.status();
  FERRY_RETURN_IF_ERROR((*sender)->accept(1));
  const Weights first = round_weights(model, 1);
  FERRY_RETURN_IF_ERROR((*sender)->send_round(part_views(first, part)).status());
  const Weights second = round_weights(model, 2);
  const std::vector<TensorView> views = part_views(second, part);
  std::vector<TensorSpec> specs;
  for (const TensorView& v : views) specs.push_back(v.spec);
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<UpdateWriter> writer,
                         UpdateWriter::begin_round(sender->get(), specs));
  for (const TensorView& v : views) FERRY_RETURN_IF_ERROR(writer->put(v));
  Status end = at_end();
  if (!end.ok()) {
    writer->abort(end);
    return end;
  }
  return writer->finish().status();
}

// Sender 1 fails after its last tensor of the update was delivered and before its round's END
// (its stream fails, or it is killed): sender 0, whose part arrived whole, must not have its
// update acknowledged, and the receiver's update fails naming sender 1. The update before
// goes through for both.
void expect_a_sender_lost_before_its_end_fails_every_update(bool killed) {
  const SyncOptions o = tiny_options();
  const std::vector<TensorSpec> model = small_model();
  auto parts = split_into_parts(model, 2);
  ASSERT_OK(parts);
  const std::string healthy = unique_address();
  const std::string doomed = unique_address();
  std::atomic<bool> fail_now{false};
  std::optional<Subprocess> child;
  std::optional<std::thread> in_process;
  Status doomed_status;
  if (killed) {  // forked before any thread starts; it waits at its stream's end to be killed
    auto forked = Subprocess::fork(
        [&](int) {
          Status s = serve_two_updates_failing_at_the_end(doomed, o, model, (*parts)[1], [] {
            while (true) ::pause();
            return ok_status();
          });
          return s.ok() ? 0 : 12;
        },
        "doomed sender");
    ASSERT_OK(forked);
    child.emplace(std::move(*forked));
  } else {
    in_process.emplace([&] {
      doomed_status = serve_two_updates_failing_at_the_end(doomed, o, model, (*parts)[1], [&] {
        while (!fail_now) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return aborted("the trainer gave up after its last tensor");
      });
    });
  }
  auto sender = Sender::create(healthy, o);
  ASSERT_OK(sender);
  std::vector<Status> healthy_updates;
  std::atomic<bool> healthy_done{false};
  std::thread serve([&] {
    Status s = (*sender)->accept(1);
    for (int update = 1; update <= 2 && s.ok(); ++update) {
      const Weights w = round_weights(model, update);
      s = (*sender)->send_round(part_views(w, (*parts)[0])).status();
      healthy_updates.push_back(s);
    }
    healthy_done = true;
  });

  auto rx = MultiReceiver::connect({healthy, doomed}, 0, o);
  ASSERT_OK(rx);
  std::atomic<std::size_t> delivered{0};
  const auto count = [&](const TensorView&) {
    ++delivered;
    return ok_status();
  };
  auto whole = (*rx)->receive_update(count);
  ASSERT_OK(whole);
  EXPECT_EQ(whole->tensors, model.size());
  delivered = 0;
  // Once every tensor of the update arrived, sender 1 goes; first sender 0 gets a second to be
  // acknowledged, which it must not be.
  std::thread fail([&] {
    const Deadline all_delivered(std::chrono::seconds(10));
    while (delivered < model.size() && !all_delivered.passed()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const Deadline acknowledged(std::chrono::seconds(1));
    while (!healthy_done && !acknowledged.passed()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (killed) {
      ::kill(child->pid(), SIGKILL);
    } else {
      fail_now = true;
    }
  });
  auto failed = (*rx)->receive_update(count);
  fail.join();
  serve.join();
  if (in_process) in_process->join();
  EXPECT_EQ(delivered, model.size());
  ASSERT_FALSE(failed.ok());
  const std::string& m = failed.status().message();
  EXPECT_NE(m.find("sender 1 (" + doomed + ")"), std::string::npos) << m;
  EXPECT_EQ(m.find("sender 0"), std::string::npos) << "the healthy sender is blamed: " << m;
  ASSERT_EQ(healthy_updates.size(), 2u);
  EXPECT_OK(healthy_updates[0]);
  ASSERT_FALSE(healthy_updates[1].ok()) << "sender 0's update was acknowledged";
  EXPECT_NE(healthy_updates[1].message().find("sender 1 (" + doomed + ") failed the round"),
            std::string::npos)
      << healthy_updates[1].to_string();
  if (killed) {
    const auto exit = child->wait(Deadline(std::chrono::milliseconds(10'000)));
    ASSERT_TRUE(exit.has_value());
    EXPECT_EQ(exit->signal, SIGKILL);
  } else {
    EXPECT_FALSE(doomed_status.ok());
  }
}

TEST(MultiReceiver, ASenderFailingAfterItsLastTensorBeforeItsEndFailsTheOthersUpdate) {
  expect_a_sender_lost_before_its_end_fails_every_update(/*killed=*/false);
}

TEST(MultiReceiver, ASenderKilledAfterItsLastTensorBeforeItsEndFailsTheOthersUpdate) {
  expect_a_sender_lost_before_its_end_fails_every_update(/*killed=*/true);
}

TEST(MultiReceiver, BadAddressListsAreRejected) {
  const SyncOptions o = tiny_options();
  auto none = MultiReceiver::connect({}, 0, o);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kInvalidArgument);
  auto twice = MultiReceiver::connect({"@ferry-twice", "@ferry-twice"}, 0, o);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("'@ferry-twice' is given twice"), std::string::npos)
      << twice.status().message();
}

}  // namespace
}  // namespace ferry::sync

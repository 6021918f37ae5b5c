// Receiver's pull form (begin_round, next_segment, release, abort): the caller drives a round
// segment by segment, holds a bucket while it asks for the next, and hands it back itself.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <thread>

#include "ferry/sync.h"
#include "support/status_matchers.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::unique_address;
using testing::Weights;

// Page-sized buckets (so writable views can run), tensors that share buckets, one that spans
// five, an empty one.
std::vector<TensorSpec> paged_model() {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 6; ++i) {
    specs.push_back(*TensorSpec::make("layer." + std::to_string(i), DType::kF32, {300 + 17 * i}));
  }
  specs.push_back(*TensorSpec::make("empty", DType::kBF16, {0}));
  specs.push_back(*TensorSpec::make("embed", DType::kU8, {5 * 4096 + 3}));
  specs.push_back(*TensorSpec::make("tail", DType::kF16, {999}));
  return specs;
}

SyncOptions paged_options() {
  SyncOptions o;
  o.bucket_bytes = 4096;
  o.slots = 2;
  o.timeout = std::chrono::milliseconds(20'000);
  return o;
}

std::vector<std::byte> bytes_of(std::span<const std::byte> s) { return {s.begin(), s.end()}; }

// Reads one round `into`, holding each bucket until the next bucket's first segment arrived
// (the most a 2-slot ring allows); checks that a held bucket's views still show its bytes then.
// Returns every tensor's bytes in the order delivered.
std::vector<std::vector<std::byte>> read_holding_one_bucket(Receiver& rx, ReadInto into,
                                                            RoundStats* stats) {
  std::vector<std::vector<std::byte>> seen;
  auto begin = rx.begin_round(into);
  EXPECT_OK(begin);
  if (!begin.ok()) return seen;
  std::int64_t held = -1;  // the bucket held, if any
  std::vector<std::pair<std::span<const std::byte>, std::vector<std::byte>>> held_views;
  std::vector<std::pair<std::span<const std::byte>, std::vector<std::byte>>> current_views;
  while (true) {
    auto segment = rx.next_segment();
    EXPECT_OK(segment);
    if (!segment.ok() || !*segment) break;
    const ReadSegment& s = **segment;
    if (held >= 0 && s.bucket != held) {  // the next bucket arrived while this one was held
      for (const auto& [view, expected] : held_views) {
        EXPECT_EQ(bytes_of(view), expected) << "bucket " << held << " changed while held";
      }
      EXPECT_OK(rx.release(static_cast<std::uint32_t>(held)));
      held = -1;
      held_views.clear();
    }
    for (const TensorView& t : s.tensors) {
      seen.push_back(bytes_of(t.data));
      current_views.emplace_back(t.data, seen.back());
    }
    for (const MutableTensorView& t : s.writable) {
      seen.push_back(bytes_of(t.data));
      current_views.emplace_back(t.data, seen.back());
    }
    if (s.bucket_ends) {
      held = s.bucket;
      held_views = std::move(current_views);
      current_views.clear();
    }
  }
  *stats = rx.round_stats();
  return seen;
}

TEST(PullRound, EveryModeArrivesBitExactAndAHeldBucketStaysIntact) {
  const SyncOptions o = paged_options();
  const std::string address = unique_address();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  const std::vector<TensorSpec> specs = paged_model();
  const std::vector<Weights> rounds{make_weights(specs, 1), make_weights(specs, 2),
                                    make_weights(specs, 3)};

  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    RoundStats stats;
    EXPECT_EQ(read_holding_one_bucket(**r, ReadInto::kViews, &stats), rounds[0].data);
    EXPECT_EQ(stats.round, 1u);
    EXPECT_GE(stats.buckets, 6u);  // "embed" spans buckets: several are held in turn

    ASSERT_OK((*r)->writable_views_error());
    EXPECT_EQ(read_holding_one_bucket(**r, ReadInto::kWritableViews, &stats), rounds[1].data);
    EXPECT_EQ(stats.round, 2u);

    Weights got = make_weights(specs, 99);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      ASSERT_OK((*r)->set_destination({specs[i], got.data[i]}));
    }
    EXPECT_TRUE(read_holding_one_bucket(**r, ReadInto::kDestinations, &stats).empty());
    EXPECT_EQ(got.data, rounds[2].data);
    EXPECT_EQ(stats.round, 3u);
  });
  ASSERT_OK((*sender)->accept(1));
  for (const Weights& w : rounds) ASSERT_OK((*sender)->send_round(w.views()));
  rx.join();
}

// The caller gives up mid-round: the sender's round fails naming the caller's reason.
TEST(PullRound, AnAbortTellsTheSenderTheCallersReason) {
  const SyncOptions o = paged_options();
  const std::string address = unique_address();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  const Weights w = make_weights(paged_model(), 4);
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    ASSERT_OK((*r)->begin_round(ReadInto::kViews));
    auto segment = (*r)->next_segment();
    ASSERT_OK(segment);
    ASSERT_TRUE(segment->has_value());
    const Status said = (*r)->abort(aborted("the model loader raised ValueError"));
    EXPECT_EQ(said.code(), Code::kAborted);
    EXPECT_NE(said.message().find("round 1 aborted: the model loader raised ValueError"),
              std::string::npos)
        << said.to_string();
    auto after = (*r)->next_segment();  // the session is broken: later calls say so
    ASSERT_FALSE(after.ok());
    EXPECT_NE(after.status().message().find("the model loader raised ValueError"),
              std::string::npos)
        << after.status().to_string();
  });
  ASSERT_OK((*sender)->accept(1));
  auto sent = (*sender)->send_round(w.views());
  rx.join();
  ASSERT_FALSE(sent.ok());
  EXPECT_NE(sent.status().message().find("the model loader raised ValueError"), std::string::npos)
      << sent.status().to_string();
}

// Calls out of order are refused with what to do instead, and leave the session working.
TEST(PullRound, MisuseIsRefusedAndTheSessionGoesOn) {
  const SyncOptions o = paged_options();
  const std::string address = unique_address();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  const Weights w = make_weights(paged_model(), 5);
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    auto early = (*r)->next_segment();
    EXPECT_EQ(early.status().code(), Code::kFailedPrecondition) << early.status().to_string();
    EXPECT_EQ((*r)->begin_round(ReadInto::kPassThrough).status().code(), Code::kInvalidArgument);
    ASSERT_OK((*r)->begin_round(ReadInto::kViews));
    auto again = (*r)->begin_round(ReadInto::kViews);
    EXPECT_EQ(again.status().code(), Code::kFailedPrecondition) << again.status().to_string();
    EXPECT_NE(again.status().message().find("inside round 1"), std::string::npos)
        << again.status().to_string();
    std::vector<std::vector<std::byte>> seen;
    std::vector<std::uint32_t> held;
    while (true) {
      auto segment = (*r)->next_segment();
      ASSERT_OK(segment);
      if (!*segment) break;
      for (const TensorView& t : (*segment)->tensors) seen.push_back(bytes_of(t.data));
      if (!(*segment)->bucket_ends) continue;
      held.push_back((*segment)->bucket);
      if (held.size() == 2) {
        const Status wrong = (*r)->release(held[1]);  // bucket held[0] is next
        EXPECT_EQ(wrong.code(), Code::kFailedPrecondition) << wrong.to_string();
        ASSERT_OK((*r)->release(held[0]));
        held.erase(held.begin());
      }
    }
    EXPECT_EQ(seen, w.data);  // a bucket left held at END was released by it
    EXPECT_EQ((*r)->round_stats().round, 1u);
  });
  ASSERT_OK((*sender)->accept(1));
  ASSERT_OK((*sender)->send_round(w.views()));
  rx.join();
}

}  // namespace
}  // namespace ferry::sync

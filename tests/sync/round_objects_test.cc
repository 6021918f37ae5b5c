// RoundWriter and RoundReader at their edges: bytes put in parts of any size, cut wherever a
// segment (16 MiB) or bucket ends, arrive bit-exact in every delivery mode; a reader's views
// outlive the segment that completed them until their bucket is released.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "ferry/sync.h"
#include "support/status_matchers.h"
#include "sync/bucket_planner.h"
#include "sync/segment.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::unique_address;
using testing::Weights;

// Tensors that straddle segment and bucket edges: one of 2.5 buckets, one ending a byte past a
// segment, empty ones between and at the end.
std::vector<TensorSpec> straddling_model() {
  return {*TensorSpec::make("big", DType::kU8, {100ull << 20}),
          *TensorSpec::make("empty.0", DType::kF32, {0}),
          *TensorSpec::make("past_segment", DType::kU8, {kSegmentBytes + 1}),
          *TensorSpec::make("odd", DType::kBF16, {12345}),
          *TensorSpec::make("empty.1", DType::kF16, {0})};
}

SyncOptions straddling_options(bool checksums) {
  SyncOptions o;
  o.bucket_bytes = 40ull << 20;  // 2.5 segments
  o.slots = 2;
  o.checksums = checksums;
  o.timeout = std::chrono::milliseconds(20'000);
  return o;
}

// Each tensor cut into parts of 1 byte to 5 MiB, seeded, so parts end at every kind of edge.
std::vector<GatheredTensor> cut_into_parts(const Weights& w, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<GatheredTensor> out;
  for (std::size_t t = 0; t < w.specs.size(); ++t) {
    GatheredTensor g{w.specs[t], {}};
    std::span<const std::byte> rest = w.data[t];
    while (!rest.empty()) {
      const std::size_t n = std::min<std::size_t>(rest.size(), 1 + rng() % (5u << 20));
      g.parts.push_back(rest.first(n));
      if (rng() % 4 == 0) g.parts.push_back({});  // empty parts too
      rest = rest.subspan(n);
    }
    out.push_back(std::move(g));
  }
  return out;
}

class StraddlingRounds : public ::testing::TestWithParam<bool> {};

TEST_P(StraddlingRounds, PartsOfAnySizeArriveBitExactInEveryMode) {
  const bool checksums = GetParam();
  const SyncOptions o = straddling_options(checksums);
  const std::string address = unique_address();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  const std::vector<TensorSpec> specs = straddling_model();
  std::vector<Weights> rounds{make_weights(specs, 1), make_weights(specs, 2),
                              make_weights(specs, 3)};

  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    // Round 1 into destinations.
    Weights got = make_weights(specs, 99);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      ASSERT_OK((*r)->set_destination({specs[i], got.data[i]}));
    }
    auto s = (*r)->receive_round_into();
    ASSERT_OK(s);
    EXPECT_EQ(got.data, rounds[0].data);
    // Round 2 per tensor: views of "big" (assembled) and of the others (the ring).
    std::vector<std::vector<std::byte>> seen;
    s = (*r)->receive_round([&](const TensorView& t) {
      seen.emplace_back(t.data.begin(), t.data.end());
      return ok_status();
    });
    ASSERT_OK(s);
    EXPECT_EQ(seen, rounds[1].data);
    // Round 3 per bucket: every view of a bucket is still intact when its bucket is handed out.
    seen.clear();
    s = (*r)->receive_round_buckets([&](std::span<const TensorView> bucket, bool) {
      for (const TensorView& t : bucket) seen.emplace_back(t.data.begin(), t.data.end());
      return ok_status();
    });
    ASSERT_OK(s);
    EXPECT_EQ(seen, rounds[2].data);
    EXPECT_GE(s->buckets, 3u);  // "big" spans buckets: the edges the test means to cut
  });
  ASSERT_OK((*sender)->accept(1));
  for (std::size_t i = 0; i < rounds.size(); ++i) {
    const std::vector<GatheredTensor> parts = cut_into_parts(rounds[i], 7 + i);
    auto stats = (*sender)->send_round_gathered(parts);
    ASSERT_OK(stats);
    EXPECT_EQ(stats->round, i + 1);
  }
  rx.join();
}

INSTANTIATE_TEST_SUITE_P(Checksums, StraddlingRounds, ::testing::Bool());

// A filled round hands the producer every byte of every tensor exactly once, segment by
// segment, and flushes once per segment before anything of it is published.
TEST(FilledRound, EveryByteIsFilledOnceAndFlushedPerSegment) {
  const SyncOptions o = straddling_options(true);
  const std::string address = unique_address();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  const std::vector<TensorSpec> specs = straddling_model();
  const Weights w = make_weights(specs, 5);
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    Weights got = make_weights(specs, 99);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      ASSERT_OK((*r)->set_destination({specs[i], got.data[i]}));
    }
    ASSERT_OK((*r)->receive_round_into());
    EXPECT_EQ(got.data, w.data);
  });
  ASSERT_OK((*sender)->accept(1));
  std::vector<std::uint64_t> filled(specs.size(), 0);
  int flushes = 0;
  auto stats = testing::send_produced(
      **sender, specs,
      [&](std::size_t i, std::uint64_t offset, std::span<std::byte> dst) {
        EXPECT_EQ(offset, filled[i]) << specs[i].name;  // in order, no gap, no repeat
        std::memcpy(dst.data(), w.data[i].data() + offset, dst.size());
        filled[i] += dst.size();
        return ok_status();
      },
      [&] {
        ++flushes;
        return ok_status();
      });
  ASSERT_OK(stats);
  for (std::size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(filled[i], specs[i].bytes());
  auto plan = plan_buckets(specs, o.bucket_bytes);
  ASSERT_OK(plan);
  int segments = 0;
  for (std::uint64_t used : plan->bucket_used) {
    segments += static_cast<int>((used + kSegmentBytes - 1) / kSegmentBytes);
  }
  EXPECT_EQ(flushes, segments);
  rx.join();
}

}  // namespace
}  // namespace ferry::sync

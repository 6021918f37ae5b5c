// Receiver::receive_round_segments_writable: writable views handed out per segment, before
// their bucket ends, with the bucket mode's lifetimes, and writes that stay private.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "support/status_matchers.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::unique_address;
using testing::Weights;

constexpr std::byte kWritten{0xAB};
constexpr std::uint64_t kMiB = 1 << 20;

// Buckets of three segments (segments are 16 MiB), two slots.
SyncOptions segment_options() {
  SyncOptions o;
  o.bucket_bytes = 48 * kMiB;
  o.slots = 2;
  o.timeout = std::chrono::milliseconds(30'000);
  return o;
}

// 3 MiB tensors (five complete in a segment) around one larger than a bucket.
std::vector<TensorSpec> model() {
  std::vector<TensorSpec> specs;
  auto layer = [&](int i) {
    specs.push_back(*TensorSpec::make("layer." + std::to_string(i), DType::kF32,
                                      {static_cast<std::int64_t>(3 * kMiB / 4)}));
  };
  for (int i = 0; i < 10; ++i) layer(i);
  specs.push_back(
      *TensorSpec::make("embed", DType::kF32, {static_cast<std::int64_t>(54 * kMiB / 4)}));
  for (int i = 10; i < 20; ++i) layer(i);
  return specs;
}

std::span<const std::byte> expected(const Weights& w, const std::string& name) {
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    if (w.specs[i].name == name) return w.data[i];
  }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

bool all_written(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == kWritten; });
}

// Counts the buckets the writing receiver is done with, so the reading one checks each
// bucket only after the writes into it.
class BucketsWritten {
 public:
  void add() {
    std::lock_guard lock(mutex_);
    ++count_;
    changed_.notify_all();
  }
  bool wait_for(int count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [&] { return count_ >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
};

// A view the caller still holds: of which bucket, and whether the caller wrote it.
struct Held {
  MutableTensorView view;
  int bucket = 0;
  bool written = false;
};

TEST(WritableSegments, TensorsArriveBeforeTheirBucketEndsAndLiveAsInBucketMode) {
  constexpr int kRounds = 2;
  const std::string address = unique_address();
  const SyncOptions o = segment_options();
  std::vector<Weights> rounds;
  for (int round = 1; round <= kRounds; ++round) rounds.push_back(make_weights(model(), round));
  ASSERT_GT(rounds[0].specs[10].bytes(), o.bucket_bytes) << "embed must be larger than a bucket";
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  BucketsWritten written;

  // Receiver 0 writes every second tensor it is handed and keeps every view as long as the
  // mode promises: its bucket's, then until the next bucket's last segment was handed out.
  std::thread writer([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    ASSERT_OK((*r)->writable_views_error());
    for (int round = 1; round <= kRounds; ++round) {
      const Weights& w = rounds[round - 1];
      std::vector<Held> held;
      std::vector<std::string> seen;
      int bucket = 0;
      int early = 0;  // tensors handed out before their bucket's last segment
      int round_ends = 0;
      auto stats = (*r)->receive_round_segments_writable([&](const WritableSegment& segment) {
        for (const Held& h : held) {
          if (h.written) {
            EXPECT_TRUE(all_written(h.view.data)) << h.view.spec.name << " lost a write";
          } else {
            EXPECT_TRUE(std::ranges::equal(h.view.data, expected(w, h.view.spec.name)))
                << h.view.spec.name << " changed while it was held";
          }
        }
        for (const MutableTensorView& v : segment.tensors) {
          EXPECT_TRUE(std::ranges::equal(v.data, expected(w, v.spec.name)))
              << "round " << round << ": " << v.spec.name << " shows wrong or stale bytes";
          const bool write = seen.size() % 2 == 0;
          if (write) std::memset(v.data.data(), 0xAB, v.data.size());
          held.push_back({v, bucket, write});
          seen.push_back(v.spec.name);
          if (!segment.bucket_ends) ++early;
        }
        EXPECT_EQ(segment.is_last, segment.round_ends);  // no round says more_follows here
        EXPECT_TRUE(!segment.round_ends || segment.bucket_ends);
        round_ends += segment.round_ends ? 1 : 0;
        if (segment.bucket_ends) {
          // The bucket before is released once this call returns: stop looking at it.
          std::erase_if(held, [&](const Held& h) { return h.bucket < bucket; });
          written.add();
          ++bucket;
        }
        return ok_status();
      });
      ASSERT_OK(stats);
      EXPECT_EQ(stats->round, static_cast<std::uint64_t>(round));
      EXPECT_EQ(round_ends, 1);
      EXPECT_GT(early, 0) << "every tensor waited for its bucket's end";
      std::vector<std::string> names;
      for (const TensorSpec& s : w.specs) names.push_back(s.name);
      EXPECT_EQ(seen, names) << "each tensor once, in send order";
    }
  });

  // Receiver 1 reads each bucket after receiver 0 wrote into it: it must see the sender's.
  std::thread reader([&] {
    auto r = Receiver::connect(address, 1, o);
    ASSERT_OK(r);
    int bucket = 0;
    for (int round = 1; round <= kRounds; ++round) {
      const Weights& w = rounds[round - 1];
      auto stats = (*r)->receive_round_buckets([&](std::span<const TensorView> views, bool) {
        EXPECT_TRUE(written.wait_for(++bucket)) << "the writer did not write bucket " << bucket;
        for (const TensorView& v : views) {
          EXPECT_TRUE(std::ranges::equal(v.data, expected(w, v.spec.name)))
              << "round " << round << ": the writer's writes reached " << v.spec.name;
        }
        return ok_status();
      });
      ASSERT_OK(stats);
    }
  });

  ASSERT_OK((*sender)->accept(2));
  for (const Weights& w : rounds) {
    auto views = w.views();
    ASSERT_OK((*sender)->send_round(views));
  }
  writer.join();
  reader.join();
}

TEST(WritableSegments, AnEmptyRoundCallsOnceWithEveryFlag) {
  const std::string address = unique_address();
  const SyncOptions o = segment_options();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    int calls = 0;
    auto stats = (*r)->receive_round_segments_writable([&](const WritableSegment& segment) {
      ++calls;
      EXPECT_TRUE(segment.tensors.empty());
      EXPECT_TRUE(segment.bucket_ends && segment.is_last && segment.round_ends);
      return ok_status();
    });
    ASSERT_OK(stats);
    EXPECT_EQ(calls, 1);
  });
  ASSERT_OK((*sender)->accept(1));
  ASSERT_OK((*sender)->send_round({}));
  rx.join();
}

TEST(WritableSegments, RefusedWithOneSlot) {
  const std::string address = unique_address();
  SyncOptions o = segment_options();
  o.slots = 1;
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  std::thread rx([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    auto stats =
        (*r)->receive_round_segments_writable([](const WritableSegment&) { return ok_status(); });
    EXPECT_EQ(stats.status().code(), Code::kFailedPrecondition);
    EXPECT_NE(stats.status().message().find("2 slots"), std::string::npos)
        << stats.status().message();
  });
  ASSERT_OK((*sender)->accept(1));
  rx.join();
}

}  // namespace
}  // namespace ferry::sync

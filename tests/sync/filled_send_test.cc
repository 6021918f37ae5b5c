// A round whose tensors a producer writes into the ring slot itself (UpdateWriter::put with a
// TensorProducer), possibly later (a device's asynchronous copy): flush() completes the copies
// of a segment before the segment is hashed and published.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/status_matchers.h"
#include "sync/sync_test_util.h"

namespace ferry::sync {
namespace {

using testing::make_weights;
using testing::RoundProducer;
using testing::send_produced;
using testing::small_model;
using testing::tiny_options;
using testing::unique_address;
using testing::Weights;

// A producer whose fills only queue the copy, as cudaMemcpyAsync does: the bytes reach the
// slot at flush(). A segment published before its flush would carry the slot's old bytes
// (a receiver's checksum or the bytes compared at the end catch it). Counts the flushes and
// the pieces each flush completed.
struct DeferredFill {
  const Weights& weights;
  struct Copy {
    std::span<std::byte> dst;
    std::size_t tensor;
    std::uint64_t offset;
  };
  std::vector<Copy> queued;
  std::vector<std::size_t> pieces_per_flush;
  std::uint64_t bytes = 0;

  Status fill(std::size_t i, std::uint64_t offset, std::span<std::byte> dst) {
    queued.push_back({dst, i, offset});
    return ok_status();
  }
  Status flush() {
    for (const Copy& c : queued) {
      std::memcpy(c.dst.data(), weights.data[c.tensor].data() + c.offset, c.dst.size());
      bytes += c.dst.size();
    }
    pieces_per_flush.push_back(queued.size());
    queued.clear();
    return ok_status();
  }
};

// Receives rounds into fresh destinations of `specs` in a thread; keeps each round's status.
struct DestinationReceiver {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<std::byte>> data;
  std::vector<Status> statuses;
  std::thread thread;

  DestinationReceiver(const std::string& address, const std::vector<TensorSpec>& s,
                      const SyncOptions& options, int rounds)
      : specs(s) {
    for (const auto& t : specs) data.emplace_back(t.bytes(), std::byte{0});
    thread = std::thread([this, address, options, rounds] {
      auto r = Receiver::connect(address, 0, options);
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

void sends_every_byte_with_deferred_copies(bool checksums) {
  SyncOptions options = tiny_options();
  options.checksums = checksums;
  const std::string address = unique_address();
  auto sender = Sender::create(address, options);
  ASSERT_OK(sender);
  // small_model()'s embedding (9 KB) is far larger than a 256-byte bucket.
  DestinationReceiver rx(address, small_model(), options, 2);
  ASSERT_OK((*sender)->accept(1));
  Weights last;
  for (std::uint64_t round = 1; round <= 2; ++round) {
    last = make_weights(small_model(), round + 20);
    DeferredFill producer{last, {}, {}, 0};
    const RoundProducer fill = [&](std::size_t i, std::uint64_t offset, std::span<std::byte> dst) {
      return producer.fill(i, offset, dst);
    };
    const FillFlush flush = [&] { return producer.flush(); };
    auto stats = send_produced(**sender, last.specs, fill, flush);
    ASSERT_OK(stats);
    EXPECT_EQ(stats->tensors, last.specs.size());
    EXPECT_TRUE(producer.queued.empty());  // every fill was flushed before the round ended
    std::uint64_t total = 0;
    for (const TensorSpec& s : last.specs) total += s.bytes();
    EXPECT_EQ(producer.bytes, total);  // each byte copied once
    // One flush per segment: with 256-byte buckets (16 MiB segments) a bucket is one segment.
    EXPECT_EQ(producer.pieces_per_flush.size(), stats->buckets);
  }
  rx.thread.join();
  ASSERT_EQ(rx.statuses.size(), 2u);
  EXPECT_OK(rx.statuses[0]);
  EXPECT_OK(rx.statuses[1]);
  for (std::size_t i = 0; i < last.specs.size(); ++i) {
    EXPECT_EQ(rx.data[i], last.data[i]) << last.specs[i].name;
  }
}

TEST(SyncFilled, DeferredCopiesArriveBitExactWithChecksums) {
  sends_every_byte_with_deferred_copies(true);
}

TEST(SyncFilled, DeferredCopiesArriveBitExactWithoutChecksums) {
  sends_every_byte_with_deferred_copies(false);
}

// Sends small_model() with `fill`/`flush`; returns the sender's status and the receiver's.
std::pair<Status, Status> fill_one_round(const RoundProducer& fill, const FillFlush& flush) {
  const std::string address = unique_address();
  auto sender = Sender::create(address, tiny_options());
  EXPECT_OK(sender);
  if (!sender.ok()) return {sender.status(), Status()};
  DestinationReceiver rx(address, small_model(), tiny_options(), 1);
  EXPECT_OK((*sender)->accept(1));
  Status sent = send_produced(**sender, small_model(), fill, flush).status();
  rx.thread.join();
  // The failed round broke the session, as any failed round does.
  EXPECT_EQ(send_produced(**sender, small_model(), fill, flush).status().code(),
            Code::kFailedPrecondition);
  return {sent, rx.statuses.empty() ? Status() : rx.statuses.back()};
}

TEST(SyncFilled, AFillErrorAbortsTheRoundNamingTheTensor) {
  const Weights w = make_weights(small_model(), 3);
  const RoundProducer fill = [&](std::size_t i, std::uint64_t offset, std::span<std::byte> dst) {
    if (i == 6) return aborted("copy from cuda:0 failed");
    std::memcpy(dst.data(), w.data[i].data() + offset, dst.size());
    return ok_status();
  };
  auto [sent, received] = fill_one_round(fill, [] { return ok_status(); });
  EXPECT_EQ(sent.code(), Code::kAborted) << sent.to_string();
  EXPECT_NE(sent.message().find("tensor 6 'lm_head.weight'"), std::string::npos) << sent.message();
  EXPECT_NE(sent.message().find("copy from cuda:0 failed"), std::string::npos) << sent.message();
  EXPECT_FALSE(received.ok());  // told, never delivered as a whole round
}

TEST(SyncFilled, AFlushErrorAbortsTheRoundNamingTheSegmentsTensors) {
  const Weights w = make_weights(small_model(), 4);
  bool lm_head_filled = false;
  const RoundProducer fill = [&](std::size_t i, std::uint64_t offset, std::span<std::byte> dst) {
    lm_head_filled = lm_head_filled || i == 6;
    std::memcpy(dst.data(), w.data[i].data() + offset, dst.size());
    return ok_status();
  };
  const FillFlush flush = [&] {
    return lm_head_filled ? internal_error("stream synchronize: illegal address") : ok_status();
  };
  auto [sent, received] = fill_one_round(fill, flush);
  EXPECT_EQ(sent.code(), Code::kInternal) << sent.to_string();
  EXPECT_NE(sent.message().find("'lm_head.weight'"), std::string::npos) << sent.message();
  EXPECT_NE(sent.message().find("illegal address"), std::string::npos) << sent.message();
  EXPECT_FALSE(received.ok());
}

TEST(SyncFilled, TheRingMemoryHoldsEverySlot) {
  const SyncOptions options = tiny_options();
  auto sender = Sender::create(unique_address(), options);
  ASSERT_OK(sender);
  const std::span<std::byte> ring = (*sender)->ring_memory();
  EXPECT_EQ(ring.size(), options.slots * options.bucket_bytes);
  ring.back() = std::byte{1};  // writable by its creator
}

}  // namespace
}  // namespace ferry::sync

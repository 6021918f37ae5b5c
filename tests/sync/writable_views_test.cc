// Receiver::receive_round_buckets_writable: the caller may write into what it receives, and
// neither the ring, the other receivers nor the next round see those writes.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

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

SyncOptions page_options() {
  SyncOptions o;
  o.bucket_bytes = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  o.slots = 2;
  o.timeout = std::chrono::milliseconds(10'000);
  return o;
}

// Tensors of about half a page (two to a bucket) and one that spans several buckets.
std::vector<TensorSpec> model() {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 9; ++i) {
    specs.push_back(*TensorSpec::make("layer." + std::to_string(i), DType::kF32, {500}));
  }
  specs.push_back(*TensorSpec::make("embed", DType::kF32, {3000}));
  return specs;
}

std::vector<std::byte> expected(const Weights& w, const std::string& name) {
  for (std::size_t i = 0; i < w.specs.size(); ++i) {
    if (w.specs[i].name == name) return w.data[i];
  }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

bool all_written(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == kWritten; });
}

// Counts the buckets the writing receiver has written, so the reading one copies each
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
    return changed_.wait_for(lock, std::chrono::seconds(10), [&] { return count_ >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
};

TEST(WritableViews, WritesStayPrivateAndEveryRoundShowsItsOwnBytes) {
  constexpr int kRounds = 3;
  const std::string address = unique_address();
  const SyncOptions o = page_options();
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  BucketsWritten written;

  // Receiver 0 writes into every second tensor it is handed, in place; the others of the
  // bucket it leaves alone, to see that the ring slot is not refilled while it holds them.
  std::thread writer([&] {
    auto r = Receiver::connect(address, 0, o);
    ASSERT_OK(r);
    ASSERT_OK((*r)->writable_views_error());
    int bucket = 0;
    for (int round = 1; round <= kRounds; ++round) {
      const Weights w = make_weights(model(), round);
      std::vector<MutableTensorView> held;
      std::vector<bool> held_written;
      auto stats = (*r)->receive_round_buckets_writable(
          [&](std::span<const MutableTensorView> views, bool is_last, bool round_ends) {
            for (std::size_t i = 0; i < held.size(); ++i) {
              if (held_written[i]) {
                EXPECT_TRUE(all_written(held[i].data)) << held[i].spec.name << " lost a write";
              } else {
                EXPECT_TRUE(std::ranges::equal(held[i].data, expected(w, held[i].spec.name)))
                    << held[i].spec.name << " changed while its bucket was held";
              }
            }
            held.clear();
            held_written.clear();
            for (std::size_t i = 0; i < views.size(); ++i) {
              const MutableTensorView& v = views[i];
              EXPECT_TRUE(std::ranges::equal(v.data, expected(w, v.spec.name)))
                  << "round " << round << ": " << v.spec.name << " shows stale bytes";
              const bool write = (i % 2) == 0;
              if (write) std::memset(v.data.data(), 0xAB, v.data.size());
              held.push_back(v);
              held_written.push_back(write);
            }
            EXPECT_EQ(is_last, round_ends);  // no round says more_follows here
            written.add();
            ++bucket;
            return ok_status();
          });
      ASSERT_OK(stats);
      EXPECT_EQ(stats->round, static_cast<std::uint64_t>(round));
    }
  });

  // Receiver 1 reads each bucket after receiver 0 wrote into it: it must see the sender's.
  std::thread reader([&] {
    auto r = Receiver::connect(address, 1, o);
    ASSERT_OK(r);
    int bucket = 0;
    for (int round = 1; round <= kRounds; ++round) {
      const Weights w = make_weights(model(), round);
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
  for (int round = 1; round <= kRounds; ++round) {
    const Weights w = make_weights(model(), round);
    auto views = w.views();
    ASSERT_OK((*sender)->send_round(views));
  }
  writer.join();
  reader.join();
}

TEST(WritableViews, RefusedWithOneSlotOrBucketsNotInPages) {
  for (const auto& [slots, bucket_bytes] :
       {std::pair<std::uint32_t, std::uint64_t>{1, page_options().bucket_bytes}, {2, 256}}) {
    const std::string address = unique_address();
    SyncOptions o = page_options();
    o.slots = slots;
    o.bucket_bytes = bucket_bytes;
    auto sender = Sender::create(address, o);
    ASSERT_OK(sender);
    std::thread rx([&] {
      auto r = Receiver::connect(address, 0, o);
      ASSERT_OK(r);
      const Status why = (*r)->writable_views_error();
      EXPECT_EQ(why.code(), Code::kFailedPrecondition) << why.to_string();
      EXPECT_NE(why.message().find(slots == 1 ? "2 slots" : "page size"), std::string::npos)
          << why.message();
      auto stats = (*r)->receive_round_buckets_writable(
          [](std::span<const MutableTensorView>, bool, bool) { return ok_status(); });
      EXPECT_EQ(stats.status().code(), Code::kFailedPrecondition);
    });
    ASSERT_OK((*sender)->accept(1));
    rx.join();
  }
}

// A view written after its lease ended (here: bucket 0's, written during bucket 2's callback)
// would change what that slot shows this receiver in every later round; the write faults
// instead. The receiver is a child process, which the fault ends.
TEST(WritableViews, AWriteAfterTheLeaseFaultsInsteadOfChangingLaterRounds) {
  const std::string address = unique_address();
  SyncOptions o = page_options();
  o.slots = 3;  // bucket 2 in a slot of its own: bucket 0's is released, not yet reused
  constexpr int kFaulted = 77;
  const pid_t child = ::fork();
  if (child == 0) {
    // The fault's exit code, not the signal: a sanitizer's own handler would report it as a
    // crash of its own (and exit 1).
    struct sigaction on_fault {};
    on_fault.sa_handler = [](int) { ::_exit(kFaulted); };
    ::sigaction(SIGSEGV, &on_fault, nullptr);
    auto r = Receiver::connect(address, 0, o);
    if (!r.ok()) ::_exit(10);
    std::byte* first_view = nullptr;
    int bucket = 0;
    (void)(*r)->receive_round_buckets_writable(
        [&](std::span<const MutableTensorView> tensors, bool, bool) {
          if (bucket == 0 && !tensors.empty()) first_view = tensors[0].data.data();
          if (bucket == 2 && first_view != nullptr) {
            // Bucket 0's lease ended with bucket 1's callback; its slot is sealed in the
            // background, before its written pages are dropped.
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            first_view[0] = kWritten;
          }
          ++bucket;
          return ok_status();
        });
    ::_exit(first_view == nullptr ? 11 : 0);  // 0: the late write went through
  }
  ASSERT_GT(child, 0);
  auto sender = Sender::create(address, o);
  ASSERT_OK(sender);
  ASSERT_OK((*sender)->accept(1));
  const Weights w = make_weights(model(), 1);
  auto views = w.views();
  EXPECT_FALSE((*sender)->send_round(views).ok()) << "the receiver died mid-round";
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), kFaulted) << "0: the late write went through";
}

}  // namespace
}  // namespace ferry::sync

// retry_in_slices and InterruptCheck on a FakeClock: the slicing, the interrupt between
// slices and the timeout's message, checked at the 3 s timeout of issue #15 in no time.
#include "sync/sync_options.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "support/fake_clock.h"
#include "support/status_matchers.h"

namespace ferry::sync {
namespace {

using ferry::testing::FakeClock;
using std::chrono::milliseconds;

// An attempt that waits out every slice it is given, on the fake clock, and times out;
// it succeeds with its attempt number from attempt `succeed_at` on (0: never).
struct SlowPeer {
  FakeClock& clock;
  int succeed_at = 0;
  std::vector<milliseconds> slices;

  Result<int> operator()(milliseconds slice) {
    slices.push_back(slice);
    if (succeed_at > 0 && static_cast<int>(slices.size()) >= succeed_at) {
      return static_cast<int>(slices.size());
    }
    clock.advance(slice);
    return timeout_error("slice of " + std::to_string(slice.count()) + " ms");
  }
};

SyncOptions with_interrupt(int* calls, Status answer = ok_status()) {
  SyncOptions o;
  o.interrupt = [calls, answer] {
    ++*calls;
    return answer;
  };
  return o;
}

TEST(RetryInSlices, TimeoutNamesTheWholeTimeNotTheLastSlice) {
  FakeClock clock;
  int interrupts = 0;
  SlowPeer peer{clock};
  auto got = retry_in_slices(
      with_interrupt(&interrupts), milliseconds(3000), "no sender at @x",
      [&](milliseconds slice) { return peer(slice); }, clock.reader());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kTimeout);
  EXPECT_EQ(got.status().message(), "no sender at @x within 3000 ms");
  // Cut into slices no longer than kInterruptSlice that add up to the timeout, with the
  // interrupt hook heard between every two of them.
  milliseconds total{0};
  for (milliseconds s : peer.slices) {
    EXPECT_LE(s, kInterruptSlice);
    total += s;
  }
  EXPECT_EQ(total, milliseconds(3000));
  EXPECT_EQ(peer.slices.size(), 3000u / kInterruptSlice.count());
  EXPECT_EQ(interrupts, static_cast<int>(peer.slices.size()) - 1);
}

TEST(RetryInSlices, WithoutAnInterruptHookOneAttemptGetsTheWholeTimeout) {
  FakeClock clock;
  SlowPeer peer{clock};
  auto got = retry_in_slices(
      SyncOptions{}, milliseconds(3000), "no answer from sender",
      [&](milliseconds slice) { return peer(slice); }, clock.reader());
  EXPECT_EQ(got.status().message(), "no answer from sender within 3000 ms");
  EXPECT_EQ(peer.slices, std::vector<milliseconds>{milliseconds(3000)});
}

TEST(RetryInSlices, AnInterruptStopsTheWaitWithTheHooksError) {
  FakeClock clock;
  int interrupts = 0;
  SlowPeer peer{clock};
  auto got = retry_in_slices(
      with_interrupt(&interrupts, aborted("KeyboardInterrupt")), milliseconds(3000),
      "no sender at @x", [&](milliseconds slice) { return peer(slice); }, clock.reader());
  EXPECT_EQ(got.status().code(), Code::kAborted);
  EXPECT_EQ(got.status().message(), "KeyboardInterrupt");
  EXPECT_EQ(peer.slices.size(), 1u);
  EXPECT_EQ(interrupts, 1);
}

TEST(RetryInSlices, APeerThatAnswersBeforeTheTimeoutIsReturned) {
  FakeClock clock;
  int interrupts = 0;
  SlowPeer peer{clock, /*succeed_at=*/7};
  auto got = retry_in_slices(
      with_interrupt(&interrupts), milliseconds(3000), "no sender at @x",
      [&](milliseconds slice) { return peer(slice); }, clock.reader());
  ASSERT_OK(got);
  EXPECT_EQ(*got, 7);
}

TEST(RetryInSlices, AnErrorOtherThanATimeoutIsReturnedAtOnce) {
  FakeClock clock;
  int attempts = 0;
  auto got = retry_in_slices(
      SyncOptions{}, milliseconds(3000), "no sender at @x",
      [&](milliseconds) -> Result<int> {
        ++attempts;
        return unauthenticated("wrong token");
      },
      clock.reader());
  EXPECT_EQ(got.status().code(), Code::kUnauthenticated);
  EXPECT_EQ(attempts, 1);
}

TEST(InterruptCheck, CallsTheHookAtMostOnceASlice) {
  FakeClock clock;
  int calls = 0;
  InterruptCheck check(with_interrupt(&calls), clock.reader());
  for (int i = 0; i < 50; ++i) EXPECT_OK(check());
  EXPECT_EQ(calls, 1);
  clock.advance(kInterruptSlice - milliseconds(1));
  EXPECT_OK(check());
  EXPECT_EQ(calls, 1);
  clock.advance(milliseconds(1));
  EXPECT_OK(check());
  EXPECT_EQ(calls, 2);
}

TEST(InterruptCheck, WithoutAHookNeverInterrupts) {
  InterruptCheck check(SyncOptions{});
  EXPECT_OK(check());
}

}  // namespace
}  // namespace ferry::sync

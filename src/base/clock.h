// The one clock ferry measures timeouts with, and a deadline built on it.
#pragma once

#include <chrono>

namespace ferry {

// Monotonic: wall-clock jumps (NTP, suspend) never fire or stretch a timeout.
using Clock = std::chrono::steady_clock;

// A point in time a wait must not pass. A negative timeout means no deadline; left() then
// reports a short slice, so a loop that polls with it still wakes up to look around.
class Deadline {
 public:
  explicit Deadline(std::chrono::milliseconds timeout)
      : at_(Clock::now() + (timeout.count() < 0 ? std::chrono::milliseconds(0) : timeout)),
        forever_(timeout.count() < 0) {}

  static Deadline never() { return Deadline(std::chrono::milliseconds(-1)); }

  bool passed() const { return !forever_ && Clock::now() >= at_; }
  bool forever() const { return forever_; }
  Clock::time_point at() const { return at_; }

  // Time left, never negative; kForeverSlice when there is no deadline.
  std::chrono::milliseconds left() const {
    if (forever_) return kForeverSlice;
    const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now());
    return d.count() < 0 ? std::chrono::milliseconds(0) : d;
  }

  static constexpr std::chrono::milliseconds kForeverSlice{50};

 private:
  Clock::time_point at_;
  bool forever_;
};

}  // namespace ferry

// A clock that moves only when the test says: timeout logic that takes its time from a
// function (sync::Now) runs at real timeouts, in no time and the same way every run.
// One thread reads and advances it.
#pragma once

#include <chrono>
#include <functional>

#include "base/clock.h"

namespace ferry::testing {

class FakeClock {
 public:
  Clock::time_point now() const { return now_; }
  void advance(Clock::duration d) { now_ += d; }
  // now() as a function, for code that takes one. The clock must outlive it.
  std::function<Clock::time_point()> reader() const {
    return [this] { return now(); };
  }

 private:
  // Not the epoch, so a "last seen at time_point{}" is long past, as on a real clock.
  Clock::time_point now_{std::chrono::hours(1)};
};

}  // namespace ferry::testing

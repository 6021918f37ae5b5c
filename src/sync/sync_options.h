// Checks shared by Sender and Receiver.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <utility>

#include "base/clock.h"
#include "ferry/sync.h"
#include "sync/bucket_planner.h"

namespace ferry::sync {

// A net receiver's or relay's ring is sized by the sender's WELCOME: refuse one above
// SyncOptions::max_ring_bytes before allocating any of it.
inline Status check_ring_size(const SyncOptions& o, const std::string& sender,
                              const std::string& who, std::uint64_t slots,
                              std::uint64_t slot_bytes) {
  // slots * slot_bytes <= limit, without the product overflowing.
  if (slots == 0 || slot_bytes <= o.max_ring_bytes / slots) return ok_status();
  return resource_exhausted(
      fmt::format("{} asks {} for a ring of {} slots x {} bytes, more than its limit of {} bytes "
                  "(SyncOptions::max_ring_bytes)",
                  sender, who, slots, slot_bytes, o.max_ring_bytes));
}

// Waits are cut into slices of at most this when SyncOptions::interrupt is set.
inline constexpr std::chrono::milliseconds kInterruptSlice{100};

// How long to wait before the next interrupt check: `left` (negative: forever) capped
// at kInterruptSlice when there is a check to make, else `left` itself.
inline std::chrono::milliseconds wait_slice(const SyncOptions& o, std::chrono::milliseconds left) {
  if (!o.interrupt) return left;
  return left.count() < 0 ? kInterruptSlice : std::min(left, kInterruptSlice);
}

// Where the two below read the time: Clock::now, or a test's fake clock, so their logic is
// tested at real timeouts (seconds) without waiting them out.
using Now = std::function<Clock::time_point()>;

// Calls SyncOptions::interrupt when a wait has gone a slice without news, at most once a
// slice however often it is asked: the hook may be costly (Python's takes the GIL).
class InterruptCheck {
 public:
  InterruptCheck() = default;  // no hook: never interrupts
  explicit InterruptCheck(const SyncOptions& o, Now now = Clock::now)
      : hook_(o.interrupt), now_(std::move(now)) {}
  Status operator()() {
    if (!hook_) return ok_status();
    const auto now = now_();
    if (now - last_ < kInterruptSlice) return ok_status();
    last_ = now;
    Status s = hook_();
    fired_ = fired_ || !s.ok();
    return s;
  }
  // Whether the hook has interrupted a wait (Ctrl-C: the caller wants out at once).
  bool fired() const { return fired_; }

 private:
  std::function<Status()> hook_;
  Now now_;
  Clock::time_point last_{};
  bool fired_ = false;
};

// Calls attempt(slice) until it returns anything but a timeout, or `timeout` (positive) has
// passed: then returns timeout_error(what + " within <timeout> ms"), the whole time the
// user gave, not the last slice's. Between slices options.interrupt is heard (Ctrl-C).
template <typename Attempt>
auto retry_in_slices(const SyncOptions& o, std::chrono::milliseconds timeout,
                     const std::string& what, Attempt attempt, const Now& now = Clock::now)
    -> decltype(attempt(timeout)) {
  InterruptCheck interrupted(o, now);
  const auto deadline = now() + timeout;
  while (true) {
    const auto left =
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now()));
    auto got = attempt(wait_slice(o, left));
    if (got.ok() || got.status().code() != Code::kTimeout) return got;
    if (now() >= deadline) {
      return timeout_error(fmt::format("{} within {} ms", what, timeout.count()));
    }
    Status s = interrupted();
    if (!s.ok()) return s;
  }
}

inline Status validate_options(const SyncOptions& o) {
  if (o.bucket_bytes < kPieceAlignment || o.bucket_bytes % kPieceAlignment != 0) {
    return invalid_argument(fmt::format("bucket_bytes {} must be a positive multiple of {}",
                                        o.bucket_bytes, kPieceAlignment));
  }
  if (o.slots < 1 || o.slots > 64) {
    return invalid_argument(fmt::format("slots {} must be 1..64", o.slots));
  }
  if (o.timeout.count() <= 0) return invalid_argument("timeout must be positive");
  return ok_status();
}

}  // namespace ferry::sync

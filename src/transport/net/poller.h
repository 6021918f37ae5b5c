// The one wait loop of a thread that serves UCX channels, alone or beside other fds (shm
// sockets, listeners). Each turn: progress() runs UCX until it has nothing left to do; the
// caller then looks at every channel (try_receive, Transfer::done); wait() arms the worker
// and sleeps until it or one of the caller's fds has news. Arming fails while events are
// pending, and wait() then returns at once, so UCX progresses again before anything sleeps.
#pragma once

#include <poll.h>

#include <chrono>
#include <vector>

#include "ferry/status.h"
#include "transport/net/context.h"

namespace ferry::net {

class Poller {
 public:
  // The longest wait() sleeps while it watches UCX: a wakeup UCX misses costs at most this.
  static constexpr std::chrono::milliseconds kMaxSleep{50};

  // `context` may be null (no net peers): wait() is then a plain poll() over the caller's fds.
  // REQUIRES: the context outlives the Poller.
  explicit Poller(Context* context) : context_(context) {}

  // Runs UCX's progress engine until it has nothing left to do; true if it did anything.
  bool progress();

  // Sleeps until one of `fds` is ready (entries with fd < 0 are skipped, as by poll()), the
  // worker has events, or `timeout` passes (negative: 0; at most kMaxSleep while it watches
  // UCX). `watch_net` false leaves UCX out (no net peer owes anything). Returns how many of
  // `fds` are ready: 0 after a timeout, a wakeup by UCX alone, a signal, or pending events
  // (then it did not sleep). An error only when poll() itself fails.
  Result<int> wait(std::vector<pollfd>& fds, std::chrono::milliseconds timeout,
                   bool watch_net = true);

 private:
  Context* context_;
};

}  // namespace ferry::net

#include "transport/net/poller.h"

#include <algorithm>
#include <cerrno>

namespace ferry::net {

bool Poller::progress() { return context_ != nullptr && context_->progress(); }

Result<int> Poller::wait(std::vector<pollfd>& fds, std::chrono::milliseconds timeout,
                         bool watch_net) {
  for (pollfd& p : fds) p.revents = 0;
  const bool watching = watch_net && context_ != nullptr;
  long long ms = std::max<long long>(timeout.count(), 0);
  if (watching) {
    if (!context_->arm()) return 0;  // events pending already: progress instead of sleeping
    ms = std::min<long long>(ms, kMaxSleep.count());
    fds.push_back({context_->event_fd(), POLLIN, 0});
  }
  int ready = ::poll(fds.data(), fds.size(), static_cast<int>(ms));
  const int error = errno;
  if (watching) {
    if (ready > 0 && fds.back().revents != 0) --ready;
    fds.pop_back();
  }
  if (ready < 0 && error == EINTR) {
    for (pollfd& p : fds) p.revents = 0;
    return 0;
  }
  if (ready < 0) return errno_status("poll", "peers", error);
  return ready;
}

}  // namespace ferry::net

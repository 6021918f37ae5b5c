// What the replicate server and puller share besides the protocol (replicate.h).
#pragma once

#include <poll.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <vector>

#include "ferry/status.h"
#include "transport/transport.h"

namespace ferry::checkpoint::replicate {

// How long an idle server or puller sleeps waiting for news.
inline constexpr std::chrono::milliseconds kPollInterval{50};
// How long a message whose first bytes arrived may take to arrive whole (shm: a message of
// several datagrams). Requests are one datagram; a peer that sends part of one and stalls
// is dropped after this, and holds the others up no longer.
inline constexpr std::chrono::milliseconds kRestOfMessage{200};

// A message that has arrived from `ch`, if any, without waiting for one: try_receive() on a
// channel that needs progress (after the caller's Poller::progress()), a poll of its own fd
// otherwise. A peer gone is kAborted naming it.
inline Result<std::optional<std::vector<std::byte>>> receive_now(transport::Channel& ch) {
  if (ch.needs_progress()) return ch.try_receive();
  pollfd p{ch.fd(), POLLIN, 0};
  const int r = ::poll(&p, 1, 0);
  if (r < 0 && errno != EINTR) return errno_status("poll", ch.peer(), errno);
  if (r <= 0) return std::optional<std::vector<std::byte>>();
  auto m = ch.receive(kRestOfMessage);
  if (!m.ok()) return m.status();
  return std::optional<std::vector<std::byte>>(std::move(*m));
}

}  // namespace ferry::checkpoint::replicate

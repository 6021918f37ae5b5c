// What the replicate server and puller share besides the protocol (replicate.h).
#pragma once

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

// A message that has arrived from `ch`, if any, without waiting for one (after the caller's
// Poller::progress()). A peer gone is kAborted naming it.
inline Result<std::optional<std::vector<std::byte>>> receive_now(transport::Channel& ch) {
  return ch.try_receive(kRestOfMessage);
}

}  // namespace ferry::checkpoint::replicate

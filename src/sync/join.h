// Joining a session from below. A receiver or a relay says HELLO to its sender (or to the
// relay above it), and the WELCOME names the ring: mapped read-only when the sender shares
// memory, else a ring of this process's own, bounded by the options before it is made and
// registered for the segments sent into it. The result reads the session's rounds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ferry/status.h"
#include "sync/round_reader.h"
#include "sync/sync_options.h"
#include "transport/registry.h"

namespace ferry::sync {

struct JoinAs {
  const char* noun = "receiver";  // "receiver" or "relay", for errors
  std::uint32_t id = 0;
  std::uint64_t session = 0;  // 0: any session the sender serves
  // The transports to connect with (a relay's, shared with what it serves, so one wait loop
  // hears all); nullptr: the join's own, from the options. Outlives the call.
  transport::Registry* transports = nullptr;
};

Result<std::unique_ptr<RoundReader>> join_session(const std::string& address, const JoinAs& as,
                                                  const SyncOptions& options);

}  // namespace ferry::sync

// Checks shared by Sender and Receiver.
#pragma once

#include <fmt/format.h>

#include "ferry/sync.h"
#include "sync/bucket_planner.h"

namespace ferry::sync {

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

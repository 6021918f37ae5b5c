// The RoundStats both ends report for a finished round, built in one place.
#pragma once

#include <chrono>
#include <cstdint>

#include "ferry/sync.h"
#include "sync/bucket_planner.h"

namespace ferry::sync {

// Fills the fields every round has; `stats` may already hold the delta fields.
inline void finish_round_stats(RoundStats* stats_out, std::uint64_t round, std::size_t tensors,
                               const BucketPlan& plan, std::chrono::steady_clock::time_point start,
                               std::uint64_t checksum) {
  RoundStats& stats = *stats_out;
  stats.round = round;
  stats.tensors = static_cast<std::uint32_t>(tensors);
  stats.buckets = plan.bucket_count();
  stats.bytes = plan.total_bytes;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.checksum = checksum;
  stats.wire_bytes = plan.total_bytes;
}

inline RoundStats finished_round(std::uint64_t round, std::size_t tensors, const BucketPlan& plan,
                                 std::chrono::steady_clock::time_point start,
                                 std::uint64_t checksum) {
  RoundStats stats;
  finish_round_stats(&stats, round, tensors, plan, start, checksum);
  return stats;
}

}  // namespace ferry::sync

// `ferry demo`: the FAQ's oversized tensor through a smaller bucket, three rounds to
// two receiver processes, every byte checked by hash.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ferry/profiler.h"
#include "ferry/status.h"

namespace ferry::tools {

struct DemoConfig {
  std::int64_t vocab = 151936;  // the FAQ's embedding: [151936, 4096] F32 = 2.49 GB
  std::int64_t hidden = 4096;
  std::uint64_t bucket_mb = 512;
  std::uint32_t receivers = 2;
  int rounds = 3;
  std::uint64_t seed = 1;
  // Delta rounds (SyncOptions::delta = kOn): round 1 is dense, later rounds change 1% of
  // the elements (a training-like update, delta/training_update.h) and send only that.
  bool delta = false;
  // When set, called once the receivers are forked; the session it returns (null: none)
  // makes the demo one profiler step and each round one task (a trace file per round with
  // discrete=true). Spans are the sender's; receivers run in other processes. Started after
  // the fork: a thread running across fork() can leave a lock held in the child forever
  // (ASan's allocator deadlocked a receiver's first new thread so).
  std::function<Result<profiler::Session*>()> start_profile;
};

struct DemoRound {
  std::uint64_t round = 0;
  std::uint64_t bytes = 0;
  std::uint32_t buckets = 0;
  std::uint32_t tensors = 0;
  double seconds = 0;
  bool delta = false;            // the round went as a delta
  std::uint64_t wire_bytes = 0;  // bytes the ring carried (encoded, for a delta)
  std::uint64_t largest_tensor_bytes = 0;
  std::vector<bool> receiver_ok;  // every tensor's hash matched the sender's
};

// Runs the demo. `on_ready` (may be empty) is called once every receiver has joined, with
// the seconds setup took (forking, backing the source, ring and destinations, joining):
// work no round is timed for. `on_round` (may be empty) is called as each round ends,
// before the receivers' hashes are known (receiver_ok empty); the result has them filled in.
Result<std::vector<DemoRound>> run_sync_demo(const DemoConfig& config,
                                             const std::function<void(double)>& on_ready,
                                             const std::function<void(const DemoRound&)>& on_round);

}  // namespace ferry::tools

// `ferry bench sync --delta-density`: delta rounds against dense rounds of the same update
// in the same run (docs/benchmarks.md). One sender process sends each update twice, on two
// sessions: dense (delta off) and delta (`delta`: auto unless told), each to its own
// receiver process in destination mode; the ratio of their round times is what a user
// gains. With `net`, each session is a net sender on loopback feeding one relay (a forked
// node with one local receiver, sync_bench's run_net_bench_node), and the bytes the
// sender's TCP sockets sent are counted per round: what a delta saves on the sender's link.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "ferry/tensor.h"

namespace ferry::tools {

struct DeltaBenchConfig {
  std::string preset = "qwen2.5-0.5b";
  DType dtype = DType::kBF16;
  std::vector<double> densities = {0.001, 0.01, 0.1, 1.0};
  // The delta session's mode: auto (what a user gets; on shm alone it sends dense rounds),
  // or on, which sends deltas on shm too and so measures the delta path itself.
  sync::DeltaMode delta = sync::DeltaMode::kAuto;
  bool adam = true;  // and one Adam step with lr 1e-6 (bf16 only), its density measured
  std::uint64_t bucket_mb = 64;
  std::uint32_t slots = 2;
  int rounds = 3;  // timed updates per row; the median is reported
  // A synthetic manifest instead of the preset: `tensor_count` tensors of `tensor_bytes`.
  std::uint32_t tensor_count = 0;
  std::uint64_t tensor_bytes = 0;
  // Through one relay per session over TCP on `host` (UCX_TLS=tcp).
  bool net = false;
  std::string host = "127.0.0.1";
};

struct DeltaBenchResult {
  std::string update;  // "density 0.01" or "adam lr 1e-06"
  double density = 0;  // the fraction of elements that changed (measured for Adam)
  std::uint64_t bytes = 0;
  double dense_seconds = 0;      // median dense round
  double delta_seconds = 0;      // median round of the delta session (auto: it may go dense)
  double speedup = 0;            // dense_seconds / delta_seconds
  bool went_delta = false;       // the median delta-session round was a delta
  std::uint64_t wire_bytes = 0;  // the delta session's bytes on the ring
  double wire_ratio = 0;         // bytes / wire_bytes
  std::uint64_t sender_extra_bytes = 0;  // the delta sender's snapshot and encode buffers
  // --net: bytes the sender's TCP sockets sent in the round (median round of each session).
  std::uint64_t dense_link_bytes = 0;
  std::uint64_t delta_link_bytes = 0;
  double link_ratio = 0;  // dense_link_bytes / delta_link_bytes
};

Result<std::vector<DeltaBenchResult>> run_delta_sync_bench(
    const DeltaBenchConfig& config, const std::function<void(const DeltaBenchResult&)>& on_result);

}  // namespace ferry::tools

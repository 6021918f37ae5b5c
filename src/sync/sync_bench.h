// `ferry bench sync`: a full round of a model-shaped state from sender memory into
// receiver destination memory, against this machine's own memcpy bandwidth.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::sync {

struct CopyBandwidth {
  double whole_gbps = 0;         // M: one pre-faulted copy of `bytes`
  double glibc_pieces_gbps = 0;  // the same bytes by glibc memcpy in `piece_bytes` pieces
  double ferry_pieces_gbps = 0;  // ... and by copy_bytes (streaming stores)
  // What two cores copy together: two threads, each memcpy-ing its own half at once.
  // N receivers plus the sender share those two cores, so this bounds their aggregate.
  double two_threads_gbps = 0;
  std::uint64_t bytes = 0;
  std::uint64_t piece_bytes = 0;
};
// Best of three runs of each, single thread.
CopyBandwidth measure_copy_bandwidth(std::uint64_t bytes, std::uint64_t piece_bytes);

struct BenchConfig {
  std::string preset = "qwen2.5-0.5b";
  std::vector<DType> dtypes = {DType::kBF16};
  std::vector<std::uint64_t> bucket_mb = {64, 256, 512, 2048};
  std::vector<std::uint32_t> receivers = {1, 2, 4};
  std::uint32_t slots = 2;
  int rounds = 3;  // timed rounds after one warm-up round; the median is reported
  bool checksums = true;
  // A synthetic manifest instead of the preset: `tensor_count` tensors of `tensor_bytes`.
  std::uint32_t tensor_count = 0;
  std::uint64_t tensor_bytes = 0;
};

struct BenchResult {
  DType dtype = DType::kBF16;
  std::uint64_t bucket_mb = 0;
  std::uint32_t receivers = 0;
  std::uint32_t tensors = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;  // median round
  double gbps = 0;     // bytes / seconds, as each receiver sees it
  double ratio_to_memcpy = 0;
  double aggregate_gbps = 0;  // receivers x bytes / seconds: what all receivers got
  double aggregate_ratio_to_two_threads = 0;
  std::uint64_t peak_rss_bytes = 0;         // largest receiver's peak RSS
  std::uint64_t sender_peak_rss_bytes = 0;  // the sender's, after this case
};

Result<std::vector<BenchResult>> run_sync_bench(
    const BenchConfig& config, const CopyBandwidth& limits,
    const std::function<void(const BenchResult&)>& on_result);

}  // namespace ferry::sync

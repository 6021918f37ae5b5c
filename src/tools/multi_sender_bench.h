// `ferry bench sync --senders 1,2`: one model split among S senders (split_into_parts), each
// a Sender on its own thread, into one MultiReceiver's destinations; the aggregate GB/s per
// sender count, against one sender in the same run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::tools {

struct MultiSenderBenchConfig {
  std::string preset = "qwen2.5-0.5b";
  DType dtype = DType::kBF16;
  std::uint64_t bucket_mb = 512;
  std::vector<std::uint32_t> senders = {1, 2};
  std::uint32_t slots = 2;
  int rounds = 3;  // timed rounds after one warm-up round
  bool checksums = true;
  // A synthetic manifest instead of the preset (bench_specs).
  std::uint32_t tensor_count = 0;
  std::uint64_t tensor_bytes = 0;
};

struct MultiSenderBenchResult {
  std::uint32_t senders = 0;
  std::uint32_t tensors = 0;
  std::uint64_t bytes = 0;         // the whole model, every sender's part together
  double seconds = 0;              // mean round at the receiver over the timed rounds
  double gbps = 0;                 // bytes / seconds: what the receiver took from all senders
  double ratio_to_one_sender = 0;  // gbps / the 1-sender case's (0 without one)
};

Result<std::vector<MultiSenderBenchResult>> run_multi_sender_bench(
    const MultiSenderBenchConfig& config,
    const std::function<void(const MultiSenderBenchResult&)>& on_result);

}  // namespace ferry::tools

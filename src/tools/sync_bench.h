// `ferry bench sync`: a full round of a model-shaped state from sender memory into
// receiver destination memory, against this machine's own memcpy bandwidth.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/sync.h"
#include "ferry/tensor.h"

namespace ferry::tools {

// The bench's manifest: `tensor_count` synthetic tensors of `tensor_bytes` each ("t.0", ...),
// or, when tensor_count is 0, the preset's shapes.
Result<std::vector<TensorSpec>> bench_specs(const std::string& preset, DType dtype,
                                            std::uint32_t tensor_count, std::uint64_t tensor_bytes);

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
  // Receivers take verl's per-bucket callback and memcpy each tensor into its destination
  // (what ferry.verl's users do: vLLM's load_weights), instead of destination mode.
  bool bucket_callback = false;
  // A synthetic manifest instead of the preset: `tensor_count` tensors of `tensor_bytes`.
  std::uint32_t tensor_count = 0;
  std::uint64_t tensor_bytes = 0;
  // Rank-local delivery: receiver i is tensor-parallel rank i % tp of tp and takes only its
  // vLLM slices of the preset's tensors (1: whole tensors).
  std::uint32_t tp = 1;
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
  std::uint64_t delivered_bytes = 0;  // most bytes one receiver copied out (tp > 1: its slices)
  std::uint64_t peak_rss_bytes = 0;   // largest receiver's peak RSS
  std::uint64_t sender_peak_rss_bytes = 0;  // the sender's, after this case
};

Result<std::vector<BenchResult>> run_sync_bench(
    const BenchConfig& config, const CopyBandwidth& limits,
    const std::function<void(const BenchResult&)>& on_result);

// ---- `ferry bench sync --net`: across nodes, against ucx_perftest on the same path ----
//
// A net Sender sends a full round to N relays ("nodes"), each republishing it over shm to
// its local receivers in destination mode. U, the limit, is ucx_perftest -t tag_bw at the
// bucket size on the same path (src/tools/ucx_perftest.h), measured in the same run.

struct NetBenchConfig {
  std::string preset = "qwen2.5-0.5b";
  DType dtype = DType::kBF16;
  std::vector<std::uint64_t> bucket_mb = {64, 512};
  std::vector<std::uint32_t> nodes = {1, 2};
  std::uint32_t receivers_per_node = 1;
  std::uint32_t slots = 2;
  int rounds = 3;  // timed rounds after one warm-up round; the median is reported
  bool checksums = true;
  // Bulk protection per run, each measured in turn (none first, for the ratios to it).
  std::vector<WireProtect> wire_protect = {sync::SyncOptions{}.wire_protect};
  std::string host = "127.0.0.1";  // the loopback run listens on host:0
  std::chrono::milliseconds timeout{60'000};
  // A synthetic manifest instead of the preset (bench_specs).
  std::uint32_t tensor_count = 0;
  std::uint64_t tensor_bytes = 0;
};

struct NetBenchResult {
  DType dtype = DType::kBF16;
  std::uint64_t bucket_mb = 0;
  std::uint32_t nodes = 0;
  WireProtect wire_protect = WireProtect::kNone;
  // gbps_per_node / the same run's under WireProtect::kNone (0 when none was not measured).
  double ratio_to_none = 0;
  std::uint32_t tensors = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;        // median round at the sender: until every node acknowledged it
  double gbps_per_node = 0;  // bytes / seconds: what each node received in that time
  double perftest_gbps = 0;  // U at this bucket size; <= 0 when ucx_perftest failed
  std::string perftest_mode;
  double ratio_to_perftest = 0;
  // seconds / the 1-node case's seconds at this bucket size (0 without a 1-node case).
  double round_time_ratio_to_one_node = 0;
  // Session setup: each relay's Relay::connect (UCX context, connect, authenticate, join).
  double setup_ms_min = 0;
  double setup_ms_max = 0;
  std::uint64_t relay_peak_rss_bytes = 0;     // largest relay's
  std::uint64_t receiver_peak_rss_bytes = 0;  // largest local receiver's
  // CPU seconds per timed round (the warm-up round left out): the sender's process, user and
  // kernel apart (its kernel time grows with the TCP streams it feeds), and one node's relay
  // with its local receivers (the mean over nodes; 0 where the nodes ran apart from the
  // sender, as in bench/sync_net_bench.sh, which reads them from the nodes' lines). `ferry
  // plan` splits a shared host's CPU between the sender and each node with them.
  double sender_cpu_user_per_round = 0;
  double sender_cpu_sys_per_round = 0;
  double node_cpu_per_round = 0;
  // The same per GB moved, each role apart (sender: per GB sent, over every node's link;
  // relay and receiver: one node's, one local receiver's, means over them),
  // beside ucx_perftest's client (sends) and server (receives) at U, whole lives included
  // (a poll-mode U spins: its CPU is its wall time).
  double sender_cpu_per_gb = 0;
  double relay_cpu_per_gb = 0;
  double receiver_cpu_per_gb = 0;
  double perftest_send_cpu_per_gb = 0;
  double perftest_recv_cpu_per_gb = 0;
};

// The loopback run: per bucket size U, then per node count a sender here and each node
// (relay + local receivers) in forked children on config.host. Sets FERRY_TOKEN to a random
// secret when neither FERRY_TOKEN nor FERRY_TOKEN_FILE is set.
Result<std::vector<NetBenchResult>> run_net_sync_bench(
    const NetBenchConfig& config, const std::function<void(const NetBenchResult&)>& on_result);

// The two ends apart, for runs across machines or namespaces (bench/sync_net_bench.sh).
// Sender end: listens on `listen` ("host:port", port 0: any), calls on_listening with the
// address it got, waits for config.nodes[0] nodes and sends rounds of config.bucket_mb[0].
// The result has no U (measured by the caller on that path) and setup times of 0.
Result<NetBenchResult> run_net_bench_sender(
    const NetBenchConfig& config, const std::string& listen,
    const std::function<void(const std::string& address)>& on_listening);

struct NetNodeResult {
  double setup_ms = 0;                // Relay::connect
  std::vector<double> round_seconds;  // relay_round() per round, warm-up included
  std::uint64_t relay_peak_rss_bytes = 0;
  std::uint64_t receiver_peak_rss_bytes = 0;
  double cpu_per_round = 0;  // CPU seconds of the relay and its local receivers, per timed round
  double relay_cpu_per_round = 0;     // the relay's process alone
  double receiver_cpu_per_round = 0;  // one local receiver's (the mean over them)
};

// Sets FERRY_TOKEN to a random secret when neither FERRY_TOKEN nor FERRY_TOKEN_FILE is set,
// before forking nodes that must share it.
Status ensure_bench_token();

// Node end: config.receivers_per_node local receivers (forked, destination mode) and a
// Relay with id `relay_id` joined to `upstream` in this process, for config.rounds + 1 rounds.
Result<NetNodeResult> run_net_bench_node(const NetBenchConfig& config, const std::string& upstream,
                                         std::uint32_t relay_id);

}  // namespace ferry::tools

// What `ferry plan` knows of this machine: per-hop rates measured by `ferry plan calibrate`
// (docs/plan.md), read back from a small versioned JSON file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ferry/status.h"

namespace ferry::plan {

inline constexpr const char* kCalibrationFormat = "ferry-plan-calibration";
inline constexpr int kCalibrationVersion = 1;

// Rates in GB/s (10^9 bytes per second). Every rate is > 0.
struct Calibration {
  // Where the figures come from: "defaults" (built in, from docs/benchmarks.md) or "measured".
  std::string source = "defaults";
  std::string measured_at;  // UTC, ISO 8601; empty for the defaults
  double load_average = 0;  // the 1-minute load average when measured (a shared machine's noise)
  double memcpy_gbps = 0;   // M: one thread's glibc memcpy of 1 GiB
  // One receiver's shm round (sender packs into the ring, receiver copies out, both hashing,
  // pipelined in 16 MiB segments): the rate of one packing or receiving core.
  double shm_round_gbps = 0;
  double two_threads_gbps = 0;  // M2: two threads copying at once (this host's memory, shared)
  // One node over the net transport on this machine: bytes / round seconds (sender, wire,
  // relay, its local receiver).
  double net_round_gbps = 0;
  double net_limit_gbps = 0;  // U: ucx_perftest tag_bw on the same path, same run
  // CPU seconds of that one-node round (0: not measured, as in files before them): what the
  // sender spends whatever the node count (packing, hashing: its user time), and what each
  // node adds (its relay and local receivers, and the sender's kernel time for its stream).
  // `--shared-host` predictions split the round between them.
  double net_cpu_fixed_s = 0;
  double net_cpu_per_node_s = 0;
  std::uint64_t bytes = 0;  // the model bytes the rounds moved
  // Delta codec: {density of changed elements, encoded bytes / dense bytes}, density
  // ascending (docs/benchmarks.md, "Delta codec"; runs, the encoding auto picks).
  std::vector<std::pair<double, double>> delta_ratios;

  // Share of a link's measured limit a ferry round reaches (net_round / net_limit, at most 1).
  double net_efficiency() const;
};

// Figures from docs/benchmarks.md (session 3, idle VM; namespaces for net), used when no
// calibration file is given.
Calibration default_calibration();

// Checks every field: a rate not > 0, a density outside (0, 1], a ratio outside (0, 1.5] or
// densities not ascending is invalid_argument naming the field.
Status validate(const Calibration& c);

std::string calibration_to_json(const Calibration& c);
// Parses and validates; every error names the field (or the JSON position) at fault.
Result<Calibration> calibration_from_json(const std::string& text);

// Whole-file read and write; errors name the path.
Result<Calibration> read_calibration(const std::string& path);
Status write_calibration(const std::string& path, const Calibration& c);

// One node's net round as `ferry bench sync --net --json` printed it on the sending side
// (role "sender"): how a calibration takes its net figures from the path a cluster uses
// (bench/sync_net_bench.sh saves them from network namespaces) instead of loopback.
struct BenchNetRound {
  double gbps_per_node = 0;  // -> Calibration::net_round_gbps
  double perftest_gbps = 0;  // 0 when the bench did not run ucx_perftest
  std::uint64_t bytes = 0;
  // CPU seconds per round; 0 when the line lacks them. node_cpu is the "node_cpu_s_per_round"
  // that bench/sync_net_bench.sh copies in from the node's own line.
  double sender_cpu_user = 0;
  double sender_cpu_sys = 0;
  double node_cpu = 0;
};
// Refuses anything but a one-node sender line with a positive rate; errors name the field.
Result<BenchNetRound> net_round_from_bench_json(const std::string& text);
// The same from a file; errors name the path.
Result<BenchNetRound> read_net_round(const std::string& path);

// Encoded / dense bytes at `density` (0, 1]: linear between the table's points, its first
// ratio below them and its last above them.
double delta_ratio(const Calibration& c, double density);

}  // namespace ferry::plan

// ferry bench sync: one round of a model-shaped state into receiver destinations,
// as a ratio to this machine's single-thread memcpy bandwidth measured in the same run.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "sync/sync_bench.h"

namespace ferry::cli {
namespace {

struct BenchArgs {
  sync::BenchConfig config;
  std::vector<std::string> dtypes = {"bf16"};
  std::uint64_t memcpy_mb = 1024;
  bool json = false;
};

int run_bench_sync(BenchArgs& a) {
  a.config.dtypes.clear();
  for (const auto& d : a.dtypes) {
    auto t = parse_dtype(d);
    if (!t.ok()) return report_error(t.status());
    a.config.dtypes.push_back(*t);
  }
  const sync::CopyBandwidth m = sync::measure_copy_bandwidth(a.memcpy_mb << 20, 16u << 20);
  if (!a.json) {
    std::printf(
        "memcpy (one thread, %llu MiB, pre-faulted): M = %.2f GB/s; in 16 MiB pieces: "
        "glibc %.2f GB/s, ferry copy_bytes %.2f GB/s\n"
        "two threads copying at once: M2 = %.2f GB/s together\n",
        static_cast<unsigned long long>(a.memcpy_mb), m.whole_gbps, m.glibc_pieces_gbps,
        m.ferry_pieces_gbps, m.two_threads_gbps);
    std::printf("%-6s %-9s %-9s %-8s %-9s %-8s %-7s %-7s %-8s %-7s %s\n", "dtype", "bucket_mb",
                "receivers", "tensors", "GB", "seconds", "GB/s", "ratio", "agg_GB/s", "agg/M2",
                "peak_rss_MB");
    std::fflush(stdout);
  }
  auto results = sync::run_sync_bench(a.config, m, [&](const sync::BenchResult& r) {
    if (a.json) return;
    std::printf("%-6s %-9llu %-9u %-8u %-9.3f %-8.4f %-7.2f %-7.2f %-8.2f %-7.2f %.0f\n",
                std::string(dtype_name(r.dtype)).c_str(),
                static_cast<unsigned long long>(r.bucket_mb), r.receivers, r.tensors, r.bytes / 1e9,
                r.seconds, r.gbps, r.ratio_to_memcpy, r.aggregate_gbps,
                r.aggregate_ratio_to_two_threads, r.peak_rss_bytes / 1048576.0);
    std::fflush(stdout);
  });
  if (!results.ok()) return report_error(results.status());
  if (a.json) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& r : *results) {
      list.push_back({{"dtype", std::string(dtype_name(r.dtype))},
                      {"bucket_mb", r.bucket_mb},
                      {"receivers", r.receivers},
                      {"tensors", r.tensors},
                      {"bytes", r.bytes},
                      {"seconds", r.seconds},
                      {"gbps", r.gbps},
                      {"ratio_to_memcpy", r.ratio_to_memcpy},
                      {"aggregate_gbps", r.aggregate_gbps},
                      {"aggregate_ratio_to_two_threads", r.aggregate_ratio_to_two_threads},
                      {"peak_rss_bytes", r.peak_rss_bytes},
                      {"sender_peak_rss_bytes", r.sender_peak_rss_bytes}});
    }
    nlohmann::ordered_json j = {{"memcpy_gbps", m.whole_gbps},
                                {"memcpy_pieces_glibc_gbps", m.glibc_pieces_gbps},
                                {"memcpy_pieces_ferry_gbps", m.ferry_pieces_gbps},
                                {"two_threads_memcpy_gbps", m.two_threads_gbps},
                                {"results", list}};
    std::cout << j.dump(2) << "\n";
  }
  return kExitOk;
}

}  // namespace

void add_bench_command(CLI::App& app, Dispatch& dispatch) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (figures, not tests)");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd =
      add_command(*bench, dispatch, "sync",
                  "Round throughput into receiver destinations, per bucket size and receiver count",
                  "ferry bench sync --bucket-mb 64,512 --receivers 1,2 --json",
                  [args] { return run_bench_sync(*args); });
  cmd->add_option("--preset", args->config.preset, "Model shapes")->capture_default_str();
  cmd->add_option("--dtype", args->dtypes, "dtypes (bf16,fp32)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--bucket-mb", args->config.bucket_mb, "Bucket sizes in MiB")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--receivers", args->config.receivers, "Receiver counts")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--rounds", args->config.rounds, "Timed rounds (after one warm-up)")
      ->capture_default_str();
  cmd->add_option("--slots", args->config.slots, "Ring slots")->capture_default_str();
  cmd->add_option("--tensors", args->config.tensor_count,
                  "Synthetic manifest of this many tensors instead of the preset");
  cmd->add_option("--tensor-bytes", args->config.tensor_bytes, "Bytes per synthetic tensor");
  cmd->add_option("--memcpy-mb", args->memcpy_mb, "Size of the memcpy reference copy")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("!--no-checksums", args->config.checksums, "Skip per-bucket checksums");
}

}  // namespace ferry::cli

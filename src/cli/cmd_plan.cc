// ferry plan: one weight update's predicted time and bottleneck on a cluster we cannot run
// here, from this machine's calibrated rates; `ferry plan calibrate` measures them.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "ferry/model.h"
#include "plan/calibration.h"
#include "plan/predict.h"
#include "tools/sync_bench.h"

namespace ferry::cli {
namespace {

struct PlanArgs {
  plan::ClusterSpec cluster;
  std::string preset;
  double params = 0;  // parameter count, instead of --preset
  std::string dtype = "bf16";
  std::string topology = "star";
  std::uint64_t bucket_mb = 512;
  double delta_density = 0;  // 0: dense
  std::string calibration;
  bool json = false;
  // calibrate
  std::string out;
  std::string calibrate_preset = "qwen2.5-0.5b";
  std::uint64_t calibrate_bucket_mb = 64;
  int rounds = 2;
  std::string net_from;       // a one-node `ferry bench sync --net --json` sender line
  double net_limit_gbps = 0;  // ucx_perftest on that path; 0: the file's, else the round's
  CLI::App* calibrate = nullptr;
};

// Dense bytes of the model: a preset's tensors, or params x the dtype's size.
Result<std::uint64_t> model_bytes(const PlanArgs& a, std::string* described) {
  auto dtype = parse_dtype(a.dtype);
  if (!dtype.ok()) return invalid_argument("--dtype: " + dtype.status().message());
  if (a.preset.empty() == (a.params <= 0)) {
    return invalid_argument("give the model as --preset NAME or --params COUNT (one of them)");
  }
  if (!a.preset.empty()) {
    auto config = model::preset(a.preset);
    if (!config.ok()) return invalid_argument("--preset: " + config.status().message());
    std::uint64_t bytes = 0;
    for (const TensorSpec& t : model::hf_tensor_specs(*config, *dtype)) bytes += t.bytes();
    *described = a.preset + " " + a.dtype;
    return bytes;
  }
  const double bytes = a.params * dtype_bits(*dtype) / 8;
  if (!(bytes >= 1 && bytes < 1e16)) return invalid_argument("--params: out of range");
  *described = std::to_string(a.params / 1e9).substr(0, 6) + "B params " + a.dtype;
  return static_cast<std::uint64_t>(bytes);
}

nlohmann::ordered_json prediction_json(const PlanArgs& a, const plan::Prediction& p,
                                       const plan::Calibration& cal) {
  const plan::ClusterSpec& c = a.cluster;
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const plan::Stage& s : p.stages) {
    stages.push_back(
        {{"name", s.name}, {"seconds", s.seconds}, {"bytes", s.bytes}, {"what", s.what}});
  }
  return {{"cluster",
           {{"nodes", c.nodes},
            {"gpus_per_node", c.gpus_per_node},
            {"nics_per_node", c.nics_per_node},
            {"nic_gbps", c.nic_gbps},
            {"model_bytes", c.model_bytes},
            {"shard_ways", c.shard_ways},
            {"senders", c.senders},
            {"sender_nodes", c.sender_nodes},
            {"topology", std::string(plan::topology_name(c.topology))},
            {"fanout", c.fanout},
            {"bucket_bytes", c.bucket_bytes},
            {"delta_density", c.delta_density ? *c.delta_density : 1.0},
            {"host_mem_gbps", c.host_mem_gbps},
            {"h2d_gbps", c.h2d_gbps},
            {"shared_host", c.shared_host}}},
          {"calibration", cal.source == "defaults" ? "defaults" : a.calibration},
          {"seconds", p.seconds},
          {"bottleneck", p.bottleneck},
          {"depth", p.depth},
          {"link_gbps", p.link_gbps},
          {"wire_ratio", p.wire_ratio},
          {"segment_bytes", p.segment_bytes},
          {"stages", stages},
          {"notes", p.notes}};
}

void print_prediction(const PlanArgs& a, const std::string& model, const plan::Prediction& p,
                      const plan::Calibration& cal) {
  const plan::ClusterSpec& c = a.cluster;
  std::printf("cluster:     %u node(s) x %u GPU(s), %s, model %s (%.3f GB)\n", c.nodes,
              c.gpus_per_node, std::string(plan::topology_name(c.topology)).c_str(), model.c_str(),
              c.model_bytes / 1e9);
  if (c.senders > 1) {
    std::printf("senders:     %u, on %u node(s)\n", c.senders, c.sender_nodes);
  }
  if (c.shared_host) {
    std::printf("links:       none (--shared-host: every node on this machine's cores)\n");
  } else {
    std::printf(
        "links:       %u x %.0f Gb/s NICs per node, %.3f GB/s in a round (x%.2f, "
        "the calibration's share of the link limit)\n",
        c.nics_per_node, c.nic_gbps, p.link_gbps, cal.net_efficiency());
  }
  if (cal.source == "defaults") {
    std::printf(
        "calibration: built-in defaults (docs/benchmarks.md, an idle 2-core VM); "
        "measure this machine with `ferry plan calibrate --out FILE`\n");
  } else {
    std::printf("calibration: %s (measured %s, load average %.1f)\n", a.calibration.c_str(),
                cal.measured_at.c_str(), cal.load_average);
  }
  std::printf("\n%-20s %10s %12s  %s\n", "stage", "seconds", "GB", "what");
  for (const plan::Stage& s : p.stages) {
    std::printf("%-20s %10.4f %12.3f  %s\n", s.name.c_str(), s.seconds, s.bytes / 1e9,
                s.what.c_str());
  }
  std::printf("\npredicted update: %.3f s   bottleneck: %s", p.seconds, p.bottleneck.c_str());
  if (!c.shared_host) {
    std::printf("   (relay depth %u, segment %llu MiB)", p.depth,
                static_cast<unsigned long long>(p.segment_bytes >> 20));
  }
  std::printf("\n");
  for (const std::string& note : p.notes) std::printf("note: %s\n", note.c_str());
}

int run_plan(PlanArgs& a) {
  auto topology = plan::parse_topology(a.topology);
  if (!topology.ok()) return usage_error("--topology: " + topology.status().message());
  a.cluster.topology = *topology;
  if (Status s = check_bucket_mb("--bucket-mb", a.bucket_mb); !s.ok()) return usage_error(s);
  a.cluster.bucket_bytes = a.bucket_mb << 20;
  if (a.delta_density != 0) a.cluster.delta_density = a.delta_density;
  std::string model;
  auto bytes = model_bytes(a, &model);
  if (!bytes.ok()) return usage_error(bytes.status());
  a.cluster.model_bytes = *bytes;

  plan::Calibration cal = plan::default_calibration();
  if (!a.calibration.empty()) {
    auto read = plan::read_calibration(a.calibration);
    if (!read.ok()) return report_error(read.status().with_context("--calibration"));
    cal = *read;
  }
  auto p = plan::predict(a.cluster, cal);
  if (!p.ok()) return usage_error(p.status());
  if (a.json) {
    std::cout << prediction_json(a, *p, cal).dump(2) << "\n";
  } else {
    print_prediction(a, model, *p, cal);
  }
  return kExitOk;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// Short measurements here, through the benchmarks' own code: memcpy, one shm round, one
// loopback net round (1 node) beside ucx_perftest.
int run_calibrate(const PlanArgs& a) {
  if (a.out.empty()) return usage_error("--out: give the calibration file to write");
  if (Status s = check_bucket_mb("--bucket-mb", a.calibrate_bucket_mb); !s.ok()) {
    return usage_error(s);
  }
  if (a.rounds < 1) return usage_error("--rounds: must be at least 1");
  // Read before measuring anything, so a bad file is refused at once.
  std::optional<plan::BenchNetRound> net_from;
  if (!a.net_from.empty()) {
    auto r = plan::read_net_round(a.net_from);
    if (!r.ok()) return report_error(r.status().with_context("--net-from"));
    net_from = *r;
  }
  plan::Calibration cal = plan::default_calibration();
  cal.source = "measured";
  cal.measured_at = utc_now();
  double load[1] = {0};
  if (getloadavg(load, 1) == 1) cal.load_average = load[0];

  std::fprintf(stderr, "calibrate: memcpy\n");
  const tools::CopyBandwidth m = tools::measure_copy_bandwidth(std::uint64_t{1} << 30, 16u << 20);
  cal.memcpy_gbps = m.whole_gbps;
  cal.two_threads_gbps = m.two_threads_gbps;

  std::fprintf(stderr, "calibrate: shm round (%s, 1 receiver)\n", a.calibrate_preset.c_str());
  tools::BenchConfig shm;
  shm.preset = a.calibrate_preset;
  shm.bucket_mb = {a.calibrate_bucket_mb};
  shm.receivers = {1};
  shm.rounds = a.rounds;
  auto shm_results = tools::run_sync_bench(shm, m, [](const tools::BenchResult&) {});
  if (!shm_results.ok()) return report_error(shm_results.status().with_context("shm round"));
  cal.shm_round_gbps = shm_results->front().gbps;
  cal.bytes = shm_results->front().bytes;

  if (net_from) {
    const plan::BenchNetRound* r = &*net_from;  // a one-node round on the path planned for
    if (r->bytes != cal.bytes) {
      return usage_error("--net-from " + a.net_from + ": its round moved " +
                         std::to_string(r->bytes) + " bytes, the shm round (--preset " +
                         a.calibrate_preset + ") " + std::to_string(cal.bytes) +
                         ": calibrate with the preset the bench ran");
    }
    cal.net_round_gbps = r->gbps_per_node;
    if (r->node_cpu > 0) {  // else left unmeasured: the line came without a node's figure
      cal.net_cpu_fixed_s = r->sender_cpu_user;
      cal.net_cpu_per_node_s = r->sender_cpu_sys + r->node_cpu;
    }
    cal.net_limit_gbps = a.net_limit_gbps > 0   ? a.net_limit_gbps
                         : r->perftest_gbps > 0 ? r->perftest_gbps
                                                : r->gbps_per_node;
    std::fprintf(stderr, "calibrate: net round from %s (%.3f GB/s per node)\n", a.net_from.c_str(),
                 cal.net_round_gbps);
  } else {
    std::fprintf(stderr, "calibrate: loopback net round (1 node) and ucx_perftest\n");
    tools::NetBenchConfig net;
    net.preset = a.calibrate_preset;
    net.bucket_mb = {a.calibrate_bucket_mb};
    net.nodes = {1};
    net.rounds = a.rounds;
    auto net_results = tools::run_net_sync_bench(net, [](const tools::NetBenchResult&) {});
    if (!net_results.ok()) return report_error(net_results.status().with_context("net round"));
    const tools::NetBenchResult& r = net_results->front();
    cal.net_round_gbps = r.gbps_per_node;
    cal.net_cpu_fixed_s = r.sender_cpu_user_per_round;
    cal.net_cpu_per_node_s = r.sender_cpu_sys_per_round + r.node_cpu_per_round;
    // Without ucx_perftest the round is its own limit (efficiency 1), which the file shows.
    cal.net_limit_gbps = r.perftest_gbps > 0 ? r.perftest_gbps : r.gbps_per_node;
  }

  if (Status s = plan::write_calibration(a.out, cal); !s.ok()) return report_error(s);
  std::cout << plan::calibration_to_json(cal);
  std::fprintf(stderr, "calibrate: wrote %s\n", a.out.c_str());
  return kExitOk;
}

}  // namespace

void add_plan_command(CLI::App& app, Dispatch& dispatch) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = add_command(
      app, dispatch, "plan",
      "Predict one weight update's time and bottleneck on a cluster (docs/plan.md)",
      "ferry plan --nodes 4 --gpus-per-node 8 --nics-per-node 8 --nic-gbps 400 "
      "--preset qwen2.5-0.5b --topology chain\n  ferry plan calibrate --out calib.json",
      [args] { return args->calibrate->parsed() ? run_calibrate(*args) : run_plan(*args); });
  plan::ClusterSpec& c = args->cluster;
  cmd->add_option("--nodes", c.nodes, "Receiving nodes (one relay each)")->capture_default_str();
  cmd->add_option("--gpus-per-node", c.gpus_per_node, "Local receivers (ranks) per node")
      ->capture_default_str();
  cmd->add_option("--nics-per-node", c.nics_per_node, "NICs per node (the sender's too)")
      ->capture_default_str();
  cmd->add_option("--nic-gbps", c.nic_gbps, "Line rate of one NIC, Gb/s");
  cmd->add_option("--preset", args->preset, "Model preset (ferry gen-model --help lists them)");
  cmd->add_option("--params", args->params, "Parameter count instead of --preset, e.g. 1.04e12");
  cmd->add_option("--dtype", args->dtype, "Weights' dtype")->capture_default_str();
  cmd->add_option("--topology", args->topology, "star, chain or tree")->capture_default_str();
  cmd->add_option("--fanout", c.fanout, "Children per node (tree)")->capture_default_str();
  cmd->add_option("--bucket-mb", args->bucket_mb, "Bucket size, MiB")->capture_default_str();
  cmd->add_option("--delta-density", args->delta_density,
                  "Share of elements changed per update, (0, 1]; default: dense");
  cmd->add_option("--shard-ways", c.shard_ways,
                  "GPUs one rollout replica spans: each receiver needs 1/shard-ways of the model")
      ->capture_default_str();
  cmd->add_option("--senders", c.senders, "Trainer ranks sending disjoint parts")
      ->capture_default_str();
  cmd->add_option("--sender-nodes", c.sender_nodes,
                  "Nodes the senders are spread over, each with --nics-per-node NICs")
      ->capture_default_str();
  cmd->add_option("--host-mem-gbps", c.host_mem_gbps,
                  "A node's memory copy rate, all cores, GB/s (default: the calibration's)");
  cmd->add_option("--h2d-gbps", c.h2d_gbps, "Host-to-device rate per GPU, GB/s (default: none)");
  cmd->add_flag("--shared-host", c.shared_host,
                "Every node is a namespace on this machine (validation runs)");
  cmd->add_option("--calibration", args->calibration,
                  "Calibration file from `ferry plan calibrate` (default: built-in figures)");
  cmd->add_flag("--json", args->json, "Print JSON");

  args->calibrate = cmd->add_subcommand(
      "calibrate", "Measure this machine's rates (memcpy, an shm round, a loopback net round)");
  args->calibrate->add_option("--out", args->out, "Calibration file to write")->required();
  args->calibrate->add_option("--preset", args->calibrate_preset, "Model the rounds move")
      ->capture_default_str();
  args->calibrate->add_option("--bucket-mb", args->calibrate_bucket_mb, "Bucket size, MiB")
      ->capture_default_str();
  args->calibrate->add_option("--rounds", args->rounds, "Timed rounds per measurement")
      ->capture_default_str();
  args->calibrate->add_option(
      "--net-from", args->net_from,
      "Take the net round from this one-node `ferry bench sync --net --listen ... --json` "
      "sender line (the path the plan is for, e.g. saved by bench/sync_net_bench.sh "
      "--save-json) instead of measuring one on loopback");
  args->calibrate->add_option("--net-limit-gbps", args->net_limit_gbps,
                              "With --net-from: ucx_perftest's GB/s on that path (default: the "
                              "file's, else the round's own rate)");
}

}  // namespace ferry::cli

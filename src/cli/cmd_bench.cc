// ferry bench sync: one round of a model-shaped state into receiver destinations,
// as a ratio to this machine's single-thread memcpy bandwidth measured in the same run.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tools/delta_sync_bench.h"
#include "tools/multi_sender_bench.h"
#include "tools/sync_bench.h"

namespace ferry::cli {
namespace {

struct BenchArgs {
  tools::BenchConfig config;
  std::vector<std::string> dtypes = {"bf16"};
  std::uint64_t memcpy_mb = 1024;
  bool json = false;
  // --net: across nodes (loopback here, or the two ends apart with --listen / --connect).
  bool net = false;
  tools::NetBenchConfig net_config;
  std::string listen;   // sender end only
  std::string connect;  // node end only
  std::uint32_t relay_id = 1;
  std::vector<std::string> wire_protect;  // --net: modes to measure; empty: the default
  CLI::Option* bucket_option = nullptr;   // --net has its own default bucket sizes
  std::vector<double> delta_densities;    // --delta-density: delta rounds against dense
  std::vector<std::uint32_t> senders;     // --senders: one model from several senders
  std::string delta = "auto";             // --delta-density: the delta session's mode
};

// --senders: one model split among S senders into one MultiReceiver, against one sender.
int run_bench_sync_senders(BenchArgs& a) {
  if (a.net) return usage_error("--senders runs over shm on this node: no --net");
  if (a.dtypes.size() != 1) return usage_error("--senders takes one --dtype");
  auto t = parse_dtype(a.dtypes[0]);
  if (!t.ok()) return usage_error(t.status());
  tools::MultiSenderBenchConfig c;
  c.preset = a.config.preset;
  c.dtype = *t;
  c.senders = a.senders;
  c.slots = a.config.slots;
  c.rounds = a.config.rounds;
  c.checksums = a.config.checksums;
  c.tensor_count = a.config.tensor_count;
  c.tensor_bytes = a.config.tensor_bytes;
  if (a.bucket_option != nullptr && a.bucket_option->count() > 0) {
    if (a.config.bucket_mb.size() != 1) return usage_error("--senders takes one --bucket-mb");
    c.bucket_mb = a.config.bucket_mb[0];
  }
  if (Status s = check_bucket_mb("--bucket-mb", c.bucket_mb); !s.ok()) return usage_error(s);
  for (std::uint32_t n : c.senders) {
    if (n < 1) return usage_error("--senders: give counts of 1 or more");
  }
  if (!a.json) {
    std::printf(
        "%s %s, %llu MiB buckets, shm: the model split among S senders (threads), one "
        "MultiReceiver into destinations, mean of %d rounds\n",
        c.preset.c_str(), a.dtypes[0].c_str(), static_cast<unsigned long long>(c.bucket_mb),
        c.rounds);
    std::printf("%-8s %-8s %-9s %-8s %-7s %s\n", "senders", "tensors", "GB", "seconds", "GB/s",
                "vs_1_sender");
    std::fflush(stdout);
  }
  auto results = tools::run_multi_sender_bench(c, [&](const tools::MultiSenderBenchResult& r) {
    if (a.json) return;
    std::printf("%-8u %-8u %-9.3f %-8.4f %-7.2f %.2f\n", r.senders, r.tensors, r.bytes / 1e9,
                r.seconds, r.gbps, r.ratio_to_one_sender);
    std::fflush(stdout);
  });
  if (!results.ok()) return report_error(results.status());
  if (a.json) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& r : *results) {
      list.push_back({{"senders", r.senders},
                      {"tensors", r.tensors},
                      {"bytes", r.bytes},
                      {"seconds", r.seconds},
                      {"gbps", r.gbps},
                      {"ratio_to_one_sender", r.ratio_to_one_sender}});
    }
    nlohmann::ordered_json j = {{"mode", "senders"},
                                {"preset", c.preset},
                                {"dtype", a.dtypes[0]},
                                {"bucket_mb", c.bucket_mb},
                                {"results", list}};
    std::cout << j.dump(2) << "\n";
  }
  return kExitOk;
}

// --delta-density: each update sent dense and as a delta, in the same run.
int run_bench_sync_delta(BenchArgs& a) {
  if (a.dtypes.size() != 1) return usage_error("--delta-density takes one --dtype");
  auto t = parse_dtype(a.dtypes[0]);
  if (!t.ok()) return usage_error(t.status());
  tools::DeltaBenchConfig c;
  c.preset = a.config.preset;
  c.dtype = *t;
  c.densities = a.delta_densities;
  auto mode = sync::parse_delta_mode(a.delta);
  if (!mode.ok()) return usage_error(mode.status().with_context("--delta"));
  c.delta = *mode;
  c.slots = a.config.slots;
  c.rounds = a.config.rounds;
  c.tensor_count = a.config.tensor_count;
  c.tensor_bytes = a.config.tensor_bytes;
  c.net = a.net;
  c.host = a.net_config.host;
  if (c.net && (!a.listen.empty() || !a.connect.empty())) {
    return usage_error("--delta-density --net runs on loopback: no --listen / --connect");
  }
  if (a.bucket_option != nullptr && a.bucket_option->count() > 0) {
    if (a.config.bucket_mb.size() != 1) return usage_error("--delta-density takes one --bucket-mb");
    c.bucket_mb = a.config.bucket_mb[0];
  }
  if (Status s = check_bucket_mb("--bucket-mb", c.bucket_mb); !s.ok()) return usage_error(s);
  if (!a.json) {
    std::printf(
        "%s %s, %llu MiB buckets, %s, 1 receiver per session in destination mode: each "
        "update sent dense (delta off) and on a delta session (%s), median of %d\n",
        c.preset.c_str(), a.dtypes[0].c_str(), static_cast<unsigned long long>(c.bucket_mb),
        c.net ? "net (TCP) on loopback through one relay" : "shm", a.delta.c_str(), c.rounds);
    std::printf("%-18s %-9s %-9s %-9s %-8s %-6s %-10s %-9s %-15s %s\n", "update", "density",
                "dense_s", "delta_s", "speedup", "delta", "wire_MB", "bytes/wire",
                "sender_extra_MB", c.net ? "link_MB dense/delta, ratio" : "");
    std::fflush(stdout);
  }
  auto results = tools::run_delta_sync_bench(c, [&](const tools::DeltaBenchResult& r) {
    if (a.json) return;
    std::printf("%-18s %-9.5f %-9.4f %-9.4f %-8.2f %-6s %-10.2f %-9.1f %-15.0f", r.update.c_str(),
                r.density, r.dense_seconds, r.delta_seconds, r.speedup, r.went_delta ? "yes" : "no",
                r.wire_bytes / 1e6, r.wire_ratio, r.sender_extra_bytes / 1e6);
    if (c.net) {
      std::printf(" %.2f / %.2f, %.1f", r.dense_link_bytes / 1e6, r.delta_link_bytes / 1e6,
                  r.link_ratio);
    }
    std::printf("\n");
    std::fflush(stdout);
  });
  if (!results.ok()) return report_error(results.status());
  if (a.json) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& r : *results) {
      list.push_back({{"update", r.update},
                      {"density", r.density},
                      {"bytes", r.bytes},
                      {"dense_seconds", r.dense_seconds},
                      {"delta_seconds", r.delta_seconds},
                      {"speedup", r.speedup},
                      {"delta", r.went_delta},
                      {"wire_bytes", r.wire_bytes},
                      {"bytes_over_wire", r.wire_ratio},
                      {"sender_extra_bytes", r.sender_extra_bytes}});
      if (c.net) {
        list.back()["dense_link_bytes"] = r.dense_link_bytes;
        list.back()["delta_link_bytes"] = r.delta_link_bytes;
        list.back()["dense_over_delta_link"] = r.link_ratio;
      }
    }
    nlohmann::ordered_json j = {{"mode", c.net ? "delta_net" : "delta"},
                                {"preset", c.preset},
                                {"dtype", a.dtypes[0]},
                                {"bucket_mb", c.bucket_mb},
                                {"delta_mode", a.delta},
                                {"results", list}};
    std::cout << j.dump(2) << "\n";
  }
  return kExitOk;
}

nlohmann::ordered_json net_result_json(const tools::NetBenchResult& r) {
  return {{"dtype", std::string(dtype_name(r.dtype))},
          {"bucket_mb", r.bucket_mb},
          {"nodes", r.nodes},
          {"wire_protect", std::string(wire_protect_name(r.wire_protect))},
          {"ratio_to_none", r.ratio_to_none},
          {"tensors", r.tensors},
          {"bytes", r.bytes},
          {"seconds", r.seconds},
          {"gbps_per_node", r.gbps_per_node},
          {"perftest_gbps", r.perftest_gbps},
          {"perftest_mode", r.perftest_mode},
          {"ratio_to_perftest", r.ratio_to_perftest},
          {"round_time_ratio_to_one_node", r.round_time_ratio_to_one_node},
          {"setup_ms_min", r.setup_ms_min},
          {"setup_ms_max", r.setup_ms_max},
          {"relay_peak_rss_bytes", r.relay_peak_rss_bytes},
          {"receiver_peak_rss_bytes", r.receiver_peak_rss_bytes},
          {"sender_cpu_user_s_per_round", r.sender_cpu_user_per_round},
          {"sender_cpu_sys_s_per_round", r.sender_cpu_sys_per_round},
          {"node_cpu_s_per_round", r.node_cpu_per_round},
          {"sender_cpu_s_per_gb", r.sender_cpu_per_gb},
          {"relay_cpu_s_per_gb", r.relay_cpu_per_gb},
          {"receiver_cpu_s_per_gb", r.receiver_cpu_per_gb},
          {"perftest_send_cpu_s_per_gb", r.perftest_send_cpu_per_gb},
          {"perftest_recv_cpu_s_per_gb", r.perftest_recv_cpu_per_gb}};
}

int run_bench_sync_net(BenchArgs& a) {
  tools::NetBenchConfig& c = a.net_config;
  if (a.dtypes.size() != 1) return usage_error("--net takes one --dtype");
  auto t = parse_dtype(a.dtypes[0]);
  if (!t.ok()) return report_error(t.status());
  c.dtype = *t;
  c.preset = a.config.preset;
  c.slots = a.config.slots;
  c.rounds = a.config.rounds;
  c.checksums = a.config.checksums;
  if (!a.wire_protect.empty()) {
    c.wire_protect.clear();
    for (const auto& m : a.wire_protect) {
      auto p = parse_wire_protect(m);
      if (!p.ok()) return usage_error(invalid_argument("--wire-protect: " + p.status().message()));
      c.wire_protect.push_back(*p);
    }
  }
  if (a.bucket_option != nullptr && a.bucket_option->count() > 0) c.bucket_mb = a.config.bucket_mb;
  if (!a.listen.empty() || !a.connect.empty()) {
    // One end of a run across machines: one bucket size, one node count.
    if (c.bucket_mb.size() != 1 || c.nodes.size() != 1) {
      return usage_error(invalid_argument(
          "--listen / --connect run one case: give one --bucket-mb and one --nodes"));
    }
  }
  if (!a.connect.empty()) {
    auto r = tools::run_net_bench_node(c, a.connect, a.relay_id);
    if (!r.ok()) return report_error(r.status());
    nlohmann::ordered_json j = {{"role", "node"},
                                {"relay_id", a.relay_id},
                                {"bucket_mb", c.bucket_mb[0]},
                                {"setup_ms", r->setup_ms},
                                {"round_seconds", r->round_seconds},
                                {"relay_peak_rss_bytes", r->relay_peak_rss_bytes},
                                {"receiver_peak_rss_bytes", r->receiver_peak_rss_bytes},
                                {"cpu_s_per_round", r->cpu_per_round},
                                {"relay_cpu_s_per_round", r->relay_cpu_per_round},
                                {"receiver_cpu_s_per_round", r->receiver_cpu_per_round}};
    if (a.json) {
      std::cout << j.dump() << "\n";
    } else {
      std::printf("relay %u: session setup (Relay::connect) %.1f ms; rounds", a.relay_id,
                  r->setup_ms);
      for (double s : r->round_seconds) std::printf(" %.3f", s);
      std::printf(" s\n");
    }
    return kExitOk;
  }
  if (!a.listen.empty()) {
    auto r = tools::run_net_bench_sender(c, a.listen, [](const std::string& address) {
      // On stderr always: with port 0 it is how scripts learn the port.
      std::fprintf(stderr, "bench sender listening on %s\n", address.c_str());
      std::fflush(stderr);
    });
    if (!r.ok()) return report_error(r.status());
    if (a.json) {
      nlohmann::ordered_json j = net_result_json(*r);
      j["role"] = "sender";
      std::cout << j.dump() << "\n";
    } else {
      std::printf("%llu MiB buckets, %u node(s): median round %.4f s, %.3f GB/s per node\n",
                  static_cast<unsigned long long>(r->bucket_mb), r->nodes, r->seconds,
                  r->gbps_per_node);
    }
    return kExitOk;
  }
  const char* tls = std::getenv("UCX_TLS");
  const char* path = std::getenv("FERRY_NET_PATH");
  if (!a.json) {
    std::printf(
        "%s %s, net sender on %s -> relays -> %u local receiver(s) each (destination mode); "
        "FERRY_NET_PATH=%s, UCX_TLS=%s; U = ucx_perftest -t tag_bw at the bucket size on %s\n",
        c.preset.c_str(), a.dtypes[0].c_str(), c.host.c_str(), c.receivers_per_node,
        path != nullptr ? path : "(unset: tcp)", tls != nullptr ? tls : "(unset)", c.host.c_str());
    std::printf("%-9s %-5s %-8s %-7s %-8s %-9s %-10s %-8s %-6s %-7s %-9s %-12s %-12s %-16s %s\n",
                "bucket_mb", "nodes", "protect", "GB", "seconds", "GB/s/node", "ratio_none",
                "U_GB/s", "U_mode", "ratio_U", "t(N)/t(1)", "setup_ms_max", "relay_rss_MB",
                "cpu_s/GB:tx/relay/rx", "U_cpu_s/GB:tx/rx");
    std::fflush(stdout);
  }
  auto results = tools::run_net_sync_bench(c, [&](const tools::NetBenchResult& r) {
    if (a.json) return;
    std::printf(
        "%-9llu %-5u %-8s %-7.3f %-8.4f %-9.3f %-10.2f %-8.3f %-6s %-7.2f %-9.2f %-12.1f %-12.0f "
        "%-20s %s\n",
        static_cast<unsigned long long>(r.bucket_mb), r.nodes,
        std::string(wire_protect_name(r.wire_protect)).c_str(), r.bytes / 1e9, r.seconds,
        r.gbps_per_node, r.ratio_to_none, r.perftest_gbps, r.perftest_mode.c_str(),
        r.ratio_to_perftest, r.round_time_ratio_to_one_node, r.setup_ms_max,
        r.relay_peak_rss_bytes / 1048576.0,
        fmt::format("{:.2f}/{:.2f}/{:.2f}", r.sender_cpu_per_gb, r.relay_cpu_per_gb,
                    r.receiver_cpu_per_gb)
            .c_str(),
        fmt::format("{:.2f}/{:.2f}", r.perftest_send_cpu_per_gb, r.perftest_recv_cpu_per_gb)
            .c_str());
    std::fflush(stdout);
  });
  if (!results.ok()) return report_error(results.status());
  if (a.json) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& r : *results) list.push_back(net_result_json(r));
    nlohmann::ordered_json j = {{"mode", "net"},
                                {"host", c.host},
                                {"preset", c.preset},
                                {"receivers_per_node", c.receivers_per_node},
                                {"ucx_tls", tls != nullptr ? tls : ""},
                                {"results", list}};
    std::cout << j.dump(2) << "\n";
  }
  return kExitOk;
}

int run_bench_sync(BenchArgs& a) {
  // Checked before the memcpy reference runs or any receiver is forked.
  for (std::uint64_t mb : a.config.bucket_mb) {
    if (Status s = check_bucket_mb("--bucket-mb", mb); !s.ok()) return usage_error(s);
  }
  for (std::uint32_t n : a.config.receivers) {
    if (n < 1) return usage_error("--receivers 0: give 1 or more");
  }
  if (a.config.rounds < 1) return usage_error("--rounds must be 1 or more");
  if (a.config.tp < 1) return usage_error("--tp 0: give 1 (whole tensors) or more");
  if (a.config.tp > 1 && a.config.tensor_count != 0) {
    return usage_error("--tp slices the preset's tensors: leave out --tensors");
  }
  if (!a.listen.empty()) {
    if (Status s = check_host_port("--listen", a.listen); !s.ok()) return usage_error(s);
  }
  if (!a.connect.empty()) {
    if (Status s = check_host_port("--connect", a.connect); !s.ok()) return usage_error(s);
  }
  if (!a.delta_densities.empty()) return run_bench_sync_delta(a);
  if (!a.senders.empty()) return run_bench_sync_senders(a);
  if (a.net) return run_bench_sync_net(a);
  a.config.dtypes.clear();
  for (const auto& d : a.dtypes) {
    auto t = parse_dtype(d);
    if (!t.ok()) return usage_error(t.status());
    a.config.dtypes.push_back(*t);
  }
  const tools::CopyBandwidth m = tools::measure_copy_bandwidth(a.memcpy_mb << 20, 16u << 20);
  if (!a.json) {
    std::printf(
        "memcpy (one thread, %llu MiB, pre-faulted): M = %.2f GB/s; in 16 MiB pieces: "
        "glibc %.2f GB/s, ferry copy_bytes %.2f GB/s\n"
        "two threads copying at once: M2 = %.2f GB/s together\n"
        "receivers deliver %s\n",
        static_cast<unsigned long long>(a.memcpy_mb), m.whole_gbps, m.glibc_pieces_gbps,
        m.ferry_pieces_gbps, m.two_threads_gbps,
        a.config.bucket_callback ? "through the per-bucket callback, memcpy per tensor (verl)"
        : a.config.tp > 1        ? "into rank-local slices (tensor-parallel ranks, vLLM's cut)"
                                 : "into destinations");
    std::printf("%-6s %-9s %-9s %-8s %-9s %-8s %-7s %-7s %-8s %-7s %s\n", "dtype", "bucket_mb",
                "receivers", "tensors", "GB", "seconds", "GB/s", "ratio", "agg_GB/s", "agg/M2",
                "peak_rss_MB");
    std::fflush(stdout);
  }
  auto results = tools::run_sync_bench(a.config, m, [&](const tools::BenchResult& r) {
    if (a.json) return;
    std::printf("%-6s %-9llu %-9u %-8u %-9.3f %-8.4f %-7.2f %-7.2f %-8.2f %-7.2f %.0f\n",
                std::string(dtype_name(r.dtype)).c_str(),
                static_cast<unsigned long long>(r.bucket_mb), r.receivers, r.tensors, r.bytes / 1e9,
                r.seconds, r.gbps, r.ratio_to_memcpy, r.aggregate_gbps,
                r.aggregate_ratio_to_two_threads, r.peak_rss_bytes / 1048576.0);
    if (a.config.tp > 1) {
      std::printf("  each receiver copied %.3f GB of the %.3f GB round (tp %u)\n",
                  r.delivered_bytes / 1e9, r.bytes / 1e9, a.config.tp);
    }
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
                      {"delivered_bytes", r.delivered_bytes},
                      {"peak_rss_bytes", r.peak_rss_bytes},
                      {"sender_peak_rss_bytes", r.sender_peak_rss_bytes}});
    }
    nlohmann::ordered_json j = {
        {"memcpy_gbps", m.whole_gbps},
        {"memcpy_pieces_glibc_gbps", m.glibc_pieces_gbps},
        {"memcpy_pieces_ferry_gbps", m.ferry_pieces_gbps},
        {"two_threads_memcpy_gbps", m.two_threads_gbps},
        {"delivery", a.config.bucket_callback ? "bucket_callback" : "destinations"},
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
                  "ferry bench sync --bucket-mb 64,512 --receivers 1,2 --json\n"
                  "  ferry bench sync --net --nodes 1,2 --bucket-mb 64,512",
                  [args] { return run_bench_sync(*args); });
  cmd->add_option("--preset", args->config.preset, "Model shapes")->capture_default_str();
  cmd->add_option("--dtype", args->dtypes, "dtypes (bf16,fp32)")
      ->delimiter(',')
      ->capture_default_str();
  args->bucket_option =
      cmd->add_option("--bucket-mb", args->config.bucket_mb, "Bucket sizes in MiB (--net: 64,512)")
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
  cmd->add_option("--tp", args->config.tp,
                  "Receiver i is tensor-parallel rank i % N of N and takes only its vLLM slices "
                  "of the preset's tensors (rank-local delivery; 1: whole tensors)")
      ->capture_default_str();
  cmd->add_flag("--bucket-callback", args->config.bucket_callback,
                "Receivers take verl's per-bucket callback and memcpy each tensor out "
                "(what ferry.verl does), instead of destination mode");
  cmd->add_option("--delta-density", args->delta_densities,
                  "Delta rounds: change this fraction of elements per update (and one Adam step, "
                  "bf16), each sent dense and as a delta in the same run (0.001,0.01,0.1,1.0); "
                  "with --net, through one relay per session over TCP, counting link bytes")
      ->delimiter(',');
  cmd->add_option("--senders", args->senders,
                  "Several senders: the model split among S senders (1,2), each its own shm "
                  "session, into one MultiReceiver; aggregate GB/s against 1 sender")
      ->delimiter(',');
  cmd->add_option("--delta", args->delta,
                  "--delta-density: the delta session's mode, auto (dense rounds on shm alone) "
                  "or on (deltas on shm too, to measure them)")
      ->capture_default_str();
  auto* net = cmd->add_flag("--net", args->net,
                            "Across nodes: a net sender, relays with local receivers, against "
                            "ucx_perftest on the same path (loopback unless --listen/--connect)");
  cmd->add_option("--nodes", args->net_config.nodes, "--net: node (relay) counts")
      ->delimiter(',')
      ->capture_default_str()
      ->needs(net);
  cmd->add_option("--receivers-per-node", args->net_config.receivers_per_node,
                  "--net: local receivers per relay")
      ->capture_default_str()
      ->needs(net);
  cmd->add_option("--wire-protect", args->wire_protect,
                  "--net: bulk protection to measure, each in turn (none,mac,encrypt); "
                  "default: SyncOptions' default")
      ->delimiter(',')
      ->needs(net);
  cmd->add_option("--host", args->net_config.host, "--net loopback run: address to listen on")
      ->capture_default_str()
      ->needs(net);
  auto* listen = cmd->add_option("--listen", args->listen,
                                 "--net, sender end only: host:port to serve nodes on")
                     ->needs(net);
  cmd->add_option("--connect", args->connect,
                  "--net, node end only: the bench sender's host:port; runs a relay and its "
                  "local receivers here")
      ->needs(net)
      ->excludes(listen);
  cmd->add_option("--id", args->relay_id, "--net --connect: this relay's id")
      ->capture_default_str()
      ->needs(net);
}

}  // namespace ferry::cli

// ferry ckpt replicate, and `ferry ckpt verify` on verl / Megatron checkpoint folders: the
// metadata only rank 0's node has (common.pt, .metadata, metadata.json, the tracker) copied
// to the other nodes over the net transport (or, on one node, shm), and a per-node report of
// what is missing.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "ferry/megatron.h"

namespace ferry::cli {
namespace {

namespace ck = ferry::checkpoint;
using json = nlohmann::ordered_json;

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

extern "C" void on_stop_signal(int) { g_stop.store(true); }

// SIGINT / SIGTERM end a server or a watch cleanly (between files, or mid-file with the
// partial file removed).
void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

struct ReplicateArgs {
  std::string root;
  std::string serve, from;
  std::string token_file;
  int clients = 0;
  bool watch = false;
  double watch_interval_s = 2.0;
  double timeout_s = 30.0;
  bool json = false;
};

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

void print_line(const std::string& s) {
  std::fputs((s + "\n").c_str(), stdout);
  std::fflush(stdout);  // a script or a test reads the address from a pipe
}

json round_json(const ck::PullRound& r) {
  json copied = json::array();
  for (const ck::PulledFile& f : r.copied) copied.push_back({{"path", f.path}, {"bytes", f.bytes}});
  return {{"round", r.round},
          {"tracker", r.tracker ? json(*r.tracker) : json(nullptr)},
          {"copied", copied},
          {"unchanged", r.unchanged},
          {"notes", r.notes}};
}

int run_serve(const ReplicateArgs& a) {
  ck::ReplicateServeOptions o{
      .root = a.root, .address = a.serve, .token_file = a.token_file, .clients = a.clients};
  o.stop = [] { return g_stop.load(); };
  o.on_listening = [&a](const std::string& address) {
    print_line(a.json ? json{{"event", "listening"}, {"address", address}, {"root", a.root}}.dump()
                      : "serving verl/Megatron metadata of " + a.root + " on " + address);
  };
  o.on_event = [&a](const std::string& e) {
    print_line(a.json ? json{{"event", "peer"}, {"message", e}}.dump() : e);
  };
  Status s = ck::serve_replicas(o);
  if (!s.ok()) return report_error(s);
  print_line(a.json ? json{{"event", "stopped"}}.dump() : "stopped");
  return kExitOk;
}

int run_pull(const ReplicateArgs& a) {
  ck::ReplicatePullOptions o{.root = a.root,
                             .from = a.from,
                             .token_file = a.token_file,
                             .watch = a.watch,
                             .watch_interval = millis(a.watch_interval_s),
                             .timeout = millis(a.timeout_s)};
  o.stop = [] { return g_stop.load(); };
  ProgressBar bar("replicate");
  if (!a.watch) o.progress = [&bar](std::uint64_t d, std::uint64_t t) { bar.update(d, t); };
  json rounds = json::array();
  o.on_round = [&](const ck::PullRound& r) {
    if (a.json) {
      // A watch prints one JSON line per round that copied something, as it happens.
      if (a.watch && !r.copied.empty()) print_line(round_json(r).dump());
      if (!a.watch) rounds.push_back(round_json(r));
      return;
    }
    for (const ck::PulledFile& f : r.copied) {
      print_line("copied " + f.path + " (" + std::to_string(f.bytes) + " bytes)");
    }
    // Notes repeat every round of a watch; the first round says them.
    if (r.round == 1) {
      for (const std::string& n : r.notes) print_line("note: server: " + n);
    }
  };
  auto result = ck::pull_replicas(o);
  if (!result.ok()) return report_error(result.status());
  const json tracker = result->tracker ? json(*result->tracker) : json(nullptr);
  if (a.json) {
    json out = {{"from", a.from},
                {"root", a.root},
                {"rounds", result->rounds},
                {"files_copied", result->files_copied},
                {"bytes_copied", result->bytes_copied},
                {"tracker", tracker}};
    if (a.watch) {
      out["stopped"] = result->stopped;
      print_line(out.dump());
    } else {
      out["round"] = rounds.empty() ? json(nullptr) : rounds.back();
      std::cout << out.dump(2) << "\n";
    }
    return kExitOk;
  }
  if (a.watch) print_line("stopped: " + result->stopped);
  print_line("replicated " + std::to_string(result->files_copied) + " file(s), " +
             std::to_string(result->bytes_copied) + " bytes from " + a.from + " into " + a.root +
             (result->tracker ? "; the tracker names step " + std::to_string(*result->tracker)
                              : "; the server offers no tracker yet"));
  return kExitOk;
}

int run_replicate(const ReplicateArgs& a) {
  if (a.serve.empty() == a.from.empty()) {
    return usage_error(invalid_argument(
        "give either --serve HOST:PORT (on the node that has the metadata) or --from HOST:PORT "
        "(on every other node)"));
  }
  if (!a.serve.empty() && a.watch) {
    return usage_error(
        invalid_argument("--watch is for the pulling side (--from); a server "
                         "always offers its newest complete steps"));
  }
  install_stop_handlers();
  return a.serve.empty() ? run_pull(a) : run_serve(a);
}

void print_verify_text(const ck::MegatronVerifyReport& r) {
  for (const ck::MegatronNodeReport& n : r.nodes) {
    for (const std::string& f : n.missing) {
      std::printf("MISSING node %s (%s): %s\n", n.node.c_str(), n.root.c_str(), f.c_str());
    }
    for (const ck::MegatronFileProblem& p : n.inconsistent) {
      std::printf("INCONSISTENT node %s (%s): %s: %s\n", n.node.c_str(), n.root.c_str(),
                  p.file.c_str(), p.message.c_str());
    }
  }
  for (const ck::MegatronNodeReport& n : r.nodes) {
    if (!n.fix.empty()) std::printf("FIX node %s: %s\n", n.node.c_str(), n.fix.c_str());
  }
  for (const std::string& n : r.notes) std::printf("note: %s\n", n.c_str());
  std::string steps;
  for (std::int64_t s : r.steps) steps += " " + std::to_string(s);
  std::printf("verl/Megatron checkpoint, %zu node(s), step(s)%s checked, tracker %s: %s\n",
              r.nodes.size(), steps.empty() ? " none" : steps.c_str(),
              r.tracker ? ("step " + std::to_string(*r.tracker)).c_str() : "absent",
              r.ok() ? "OK" : "FAILED");
}

}  // namespace

std::optional<int> run_megatron_verify(const std::vector<std::string>& args,
                                       std::optional<std::int64_t> step, bool as_json) {
  const auto roots = ck::expand_megatron_roots(args);
  if (roots.empty()) return std::nullopt;
  auto report = ck::verify_megatron(roots, step);
  if (!report.ok()) return report_error(report.status());
  if (as_json) {
    json nodes = json::array();
    for (const ck::MegatronNodeReport& n : report->nodes) {
      json bad = json::array();
      for (const ck::MegatronFileProblem& p : n.inconsistent) {
        bad.push_back({{"file", p.file}, {"message", p.message}});
      }
      nodes.push_back({{"root", n.root},
                       {"node", n.node},
                       {"ok", n.ok()},
                       {"missing", n.missing},
                       {"inconsistent", bad},
                       {"fix", n.fix}});
    }
    std::cout << json{{"format", "verl-megatron"},
                      {"ok", report->ok()},
                      {"tracker", report->tracker ? json(*report->tracker) : json(nullptr)},
                      {"steps", report->steps},
                      {"nodes", nodes},
                      {"notes", report->notes}}
                     .dump(2)
              << "\n";
  } else {
    print_verify_text(*report);
  }
  return report->ok() ? kExitOk : kExitFailure;
}

void add_ckpt_verl_commands(CLI::App& ckpt, Dispatch& dispatch) {
  auto a = std::make_shared<ReplicateArgs>();
  CLI::App* c = add_command(
      ckpt, dispatch, "replicate",
      "verl/Megatron checkpoints on non-shared storage: copy common.pt, .metadata, metadata.json "
      "and latest_checkpointed_iteration.txt of complete steps from the node that has them "
      "(--serve) to the others (--from), over the authenticated net transport (HOST:PORT), or "
      "between two processes of one node over shm (@NAME)",
      "ferry ckpt replicate /ckpt --serve 0.0.0.0:7100   # rank 0's node\n"
      "  ferry ckpt replicate /ckpt --from node0:7100 --watch   # every other node",
      [a] { return run_replicate(*a); });
  c->add_option("DIR", a->root, "The checkpoint folder (verl's trainer.default_local_dir)")
      ->required();
  c->add_option("--serve", a->serve,
                "Serve this node's metadata on HOST:PORT (port 0: any free), or on @NAME to "
                "processes of this node (shm)");
  c->add_option("--from", a->from, "Pull from the server at HOST:PORT (or @NAME) into DIR");
  c->add_option(
       "--clients", a->clients,
       "With --serve: exit after this many one-shot pulls finished (0: until SIGINT/SIGTERM)")
      ->check(CLI::NonNegativeNumber);
  c->add_flag("--watch", a->watch,
              "With --from: keep pulling new steps as they complete, until SIGINT/SIGTERM or the "
              "server goes away");
  c->add_option("--watch-interval", a->watch_interval_s, "Seconds between pulls of a watch")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  c->add_option("--timeout", a->timeout_s, "Seconds to wait for connecting and for each answer")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  c->add_option("--token-file", a->token_file,
                "File with the session secret, mode 0600 (default: FERRY_TOKEN, else "
                "FERRY_TOKEN_FILE)");
  c->add_flag("--json", a->json, "Print JSON (one line per event for --serve and --watch)");
}

}  // namespace ferry::cli

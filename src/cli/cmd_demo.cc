// ferry demo: the FAQ's "too large to fit in the bucket" case, done.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "ferry/profiler.h"
#include "tools/sync_demo.h"

namespace ferry::cli {
namespace {

struct DemoArgs {
  tools::DemoConfig config;
  bool json = false;
  bool profile = false;
  std::string profile_dir;
  std::vector<std::string> overrides;  // verl's profiler overrides, e.g. ...npu.level=1
};

// The profiler session `--profile` / verl overrides ask for, or null when profiling is off.
Result<std::unique_ptr<profiler::Session>> start_profiler(const DemoArgs& a) {
  profiler::Config config;
  config.enable = a.profile;
  for (const std::string& o : a.overrides) {
    auto applied = profiler::apply_override(&config, o);
    if (!applied.ok()) return applied.status();
    if (!*applied) return invalid_argument("'" + o + "' is not a profiler override");
  }
  if (!config.enable && !a.overrides.empty()) config.enable = true;
  if (!config.enable) return std::unique_ptr<profiler::Session>();
  if (!a.profile_dir.empty()) config.save_path = a.profile_dir;
  return profiler::Session::start(config, {0, "sender"});
}

// What is wrong in the command line, in flag names, before any process is forked.
Status check_args(const DemoArgs& a) {
  const auto& c = a.config;
  if (c.vocab <= 0) return invalid_argument("--vocab must be positive");
  if (c.hidden < 8 || c.hidden % 8 != 0) {
    return invalid_argument("--hidden " + std::to_string(c.hidden) + ": give a multiple of 8");
  }
  if (c.receivers < 1) return invalid_argument("--receivers 0: give 1 or more");
  if (c.rounds < 1)
    return invalid_argument("--rounds " + std::to_string(c.rounds) + ": give 1 or more");
  if (Status st = check_bucket_mb("--bucket-mb", c.bucket_mb); !st.ok()) return st;
  profiler::Config scratch;
  for (const std::string& o : a.overrides) {
    auto applied = profiler::apply_override(&scratch, o);
    if (!applied.ok()) return applied.status();
    if (!*applied) return invalid_argument("'" + o + "' is not a profiler override");
  }
  return ok_status();
}

int run_demo(const DemoArgs& a) {
  if (Status s = check_args(a); !s.ok()) return usage_error(s);
  const auto& c = a.config;
  if (!a.json) {
    std::printf(
        "embedding [%lld, %lld] F32 = %s through a %llu MiB bucket, %d rounds to %u "
        "receiver processes\n",
        static_cast<long long>(c.vocab), static_cast<long long>(c.hidden),
        format_bytes(static_cast<std::uint64_t>(c.vocab * c.hidden * 4)).c_str(),
        static_cast<unsigned long long>(c.bucket_mb), c.rounds, c.receivers);
    std::fflush(stdout);
  }
  std::unique_ptr<profiler::Session> session;
  tools::DemoConfig config = c;
  config.start_profile = [&a, &session]() -> Result<profiler::Session*> {
    auto started = start_profiler(a);
    if (!started.ok()) return started.status();
    session = std::move(*started);
    return session.get();
  };
  double setup_seconds = 0;
  auto on_ready = [&a, &setup_seconds](double seconds) {
    setup_seconds = seconds;
    if (a.json) return;
    // Said apart from the rounds: backing the memory moved out of round 1 into here.
    std::printf("setup  %.3f s (fork receivers, back source, ring and destinations, join)\n",
                seconds);
    std::printf("%-6s %-8s %-8s %-9s %-8s %-8s %-6s %s\n", "round", "tensors", "buckets", "GiB",
                "seconds", "GB/s", "delta", "wire_GiB");
    std::fflush(stdout);
  };
  // Each round is printed as it ends; the receivers' verdict comes when they exit.
  auto rounds = tools::run_sync_demo(config, on_ready, [&a](const tools::DemoRound& d) {
    if (a.json) return;
    std::printf("%-6llu %-8u %-8u %-9.3f %-8.3f %-8.2f %-6s %.4f\n",
                static_cast<unsigned long long>(d.round), d.tensors, d.buckets,
                d.bytes / double(1 << 30), d.seconds,
                d.seconds > 0 ? d.bytes / 1e9 / d.seconds : 0.0, d.delta ? "yes" : "no",
                d.wire_bytes / double(1 << 30));
    std::fflush(stdout);
  });
  if (!rounds.ok()) return report_error(rounds.status());
  if (session) {
    auto files = session->stop();
    if (!files.ok()) return report_error(files.status());
    std::fprintf(stderr, "profile: traces in %s (ferry trace summarize %s/*.json)\n",
                 session->config().save_path.c_str(), session->config().save_path.c_str());
  }
  bool all_ok = true;
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const auto& d : *rounds) {
    int ok = 0;
    for (bool b : d.receiver_ok) ok += b ? 1 : 0;
    all_ok = all_ok && ok == static_cast<int>(d.receiver_ok.size());
    if (a.json) {
      j.push_back({{"round", d.round},
                   {"tensors", d.tensors},
                   {"buckets", d.buckets},
                   {"bytes", d.bytes},
                   {"seconds", d.seconds},
                   {"delta", d.delta},
                   {"wire_bytes", d.wire_bytes},
                   {"largest_tensor_bytes", d.largest_tensor_bytes},
                   {"receivers_verified", ok},
                   {"receivers", d.receiver_ok.size()}});
    } else {
      std::printf("round %llu: %d/%zu receivers bit-exact (XXH3 per tensor)\n",
                  static_cast<unsigned long long>(d.round), ok, d.receiver_ok.size());
    }
  }
  // The first update is the one a user judges: how it compares with a steady-state round.
  const double first_over_second = rounds->size() >= 2 && (*rounds)[1].seconds > 0
                                       ? (*rounds)[0].seconds / (*rounds)[1].seconds
                                       : 0.0;
  if (a.json) {
    nlohmann::ordered_json out{{"setup_seconds", setup_seconds}, {"rounds", j}};
    if (rounds->size() >= 2) out["round1_over_round2"] = first_over_second;
    out["ok"] = all_ok;
    std::cout << out.dump(2) << "\n";
  } else if (rounds->size() >= 2) {
    std::printf("round 1 took %.2fx as long as round 2\n", first_over_second);
  }
  if (!all_ok) return report_error(corruption("a receiver's bytes differ from the sender's"));
  if (!a.json)
    std::printf("ok: the largest tensor is larger than the bucket, and nothing failed\n");
  return kExitOk;
}

}  // namespace

void add_demo_command(CLI::App& app, Dispatch& dispatch) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* cmd = add_command(
      app, dispatch, "demo",
      "Sync a model whose largest tensor exceeds the bucket to 2 receiver processes, verified",
      "ferry demo\n  ferry demo --vocab 8192 --bucket-mb 16   (a smaller, faster run)",
      [args] { return run_demo(*args); });
  cmd->add_option("--vocab", args->config.vocab, "Embedding rows")->capture_default_str();
  cmd->add_option("--hidden", args->config.hidden, "Hidden size")->capture_default_str();
  cmd->add_option("--bucket-mb", args->config.bucket_mb, "Bucket size in MiB")
      ->capture_default_str();
  cmd->add_option("--receivers", args->config.receivers, "Receiver processes")
      ->capture_default_str();
  cmd->add_option("--rounds", args->config.rounds, "Rounds")->capture_default_str();
  cmd->add_flag("--delta", args->config.delta,
                "Delta rounds: after round 1, change 1% of the elements (training-like) and "
                "send only what changed");
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->add_flag("--profile", args->profile, "Record the sender's spans as Chrome/Perfetto traces");
  cmd->add_option("--profile-dir", args->profile_dir, "Where traces go (profiler.save_path)");
  cmd->add_option("overrides", args->overrides,
                  "verl profiler overrides, e.g. "
                  "actor_rollout_ref.actor.profiler.tool_config.npu.discrete=true");
}

}  // namespace ferry::cli

// ferry sync serve / ferry sync recv: the two ends of a weight-sync session, by hand.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "ferry/model.h"
#include "ferry/sync.h"

namespace ferry::cli {
namespace {

struct SyncArgs {
  std::string address = "@ferry-sync";
  std::string preset = "qwen2.5-0.5b";
  std::string dtype = "bf16";
  std::uint64_t bucket_mb = 512;
  std::uint32_t slots = 2;
  std::uint32_t receivers = 1;
  std::uint32_t id = 0;
  int rounds = 1;
  double timeout_s = 60;
  bool no_checksums = false;
  bool json = false;
};

sync::SyncOptions options_of(const SyncArgs& a) {
  sync::SyncOptions o;
  o.bucket_bytes = a.bucket_mb << 20;
  o.slots = a.slots;
  o.timeout = std::chrono::milliseconds(static_cast<long long>(a.timeout_s * 1000));
  o.checksums = !a.no_checksums;
  return o;
}

void print_round(const SyncArgs& a, const sync::RoundStats& s, const char* role) {
  if (a.json) {
    nlohmann::ordered_json j = {{"role", role},
                                {"round", s.round},
                                {"tensors", s.tensors},
                                {"buckets", s.buckets},
                                {"bytes", s.bytes},
                                {"seconds", s.seconds},
                                {"checksum", fmt::format("{:016x}", s.checksum)}};
    std::cout << j.dump() << std::endl;
    return;
  }
  std::printf(
      "round %llu: %u tensors, %u buckets, %.3f GB in %.3f s (%.2f GB/s), checksum %016llx\n",
      static_cast<unsigned long long>(s.round), s.tensors, s.buckets, s.bytes / 1e9, s.seconds,
      s.seconds > 0 ? s.bytes / 1e9 / s.seconds : 0.0, static_cast<unsigned long long>(s.checksum));
  std::fflush(stdout);
}

int run_serve(const SyncArgs& a) {
  auto cfg = model::preset(a.preset);
  if (!cfg.ok()) return report_error(cfg.status());
  auto dtype = parse_dtype(a.dtype);
  if (!dtype.ok()) return report_error(dtype.status());
  const std::vector<TensorSpec> specs = model::hf_tensor_specs(*cfg, *dtype);
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorView> views;
  auto sender = sync::Sender::create(a.address, options_of(a));
  if (!sender.ok()) return report_error(sender.status());
  for (const TensorSpec& s : specs) data.emplace_back(s.bytes());
  if (!a.json) {
    std::printf("serving %s (%zu tensors) on %s, session %016llx; waiting for %u receiver(s)\n",
                a.preset.c_str(), specs.size(), a.address.c_str(),
                static_cast<unsigned long long>((*sender)->session_id()), a.receivers);
    std::fflush(stdout);
  }
  Status s = (*sender)->accept(a.receivers);
  if (!s.ok()) return report_error(s);
  for (int r = 1; r <= a.rounds; ++r) {
    views.clear();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      model::fill_synthetic(static_cast<std::uint64_t>(r), specs[i].name, 0, data[i]);
      views.push_back({specs[i], data[i]});
    }
    auto st = (*sender)->send_round(views);
    if (!st.ok()) return report_error(st.status());
    print_round(a, *st, "sender");
  }
  return kExitOk;
}

int run_recv(const SyncArgs& a) {
  auto rx = sync::Receiver::connect(a.address, a.id, options_of(a));
  if (!rx.ok()) return report_error(rx.status());
  for (int r = 0; r < a.rounds; ++r) {
    // Per-tensor delivery; the round checksum printed below is what both ends agreed on.
    auto st = (*rx)->receive_round([](const TensorView&) { return ok_status(); });
    if (!st.ok()) return report_error(st.status());
    print_round(a, *st, "receiver");
  }
  return kExitOk;
}

}  // namespace

void add_sync_command(CLI::App& app, Dispatch& dispatch) {
  CLI::App* sync = app.add_subcommand("sync", "Weight sync on one node: the two ends of a session");
  sync->require_subcommand(1);
  auto args = std::make_shared<SyncArgs>();
  CLI::App* serve = add_command(
      *sync, dispatch, "serve",
      "Serve rounds of a model-shaped synthetic state to N receivers over a shared-memory ring",
      "ferry sync serve --address @job42 --receivers 2 --rounds 3 --bucket-mb 64",
      [args] { return run_serve(*args); });
  serve->add_option("--address", args->address, "@abstract-name or socket file path")
      ->capture_default_str();
  serve->add_option("--preset", args->preset, "Model shapes to send")->capture_default_str();
  serve->add_option("--dtype", args->dtype, "dtype of the tensors")->capture_default_str();
  serve->add_option("--bucket-mb", args->bucket_mb, "Bucket (ring slot) size in MiB")
      ->capture_default_str();
  serve->add_option("--slots", args->slots, "Ring slots (buckets in flight)")
      ->capture_default_str();
  serve->add_option("--receivers", args->receivers, "Receivers to wait for")->capture_default_str();
  serve->add_option("--rounds", args->rounds, "Rounds to send")->capture_default_str();
  serve->add_option("--timeout", args->timeout_s, "Seconds to wait for a peer")
      ->capture_default_str();
  serve->add_flag("--no-checksums", args->no_checksums, "Skip per-bucket XXH3 checksums");
  serve->add_flag("--json", args->json, "Print one JSON object per round");
  auto rargs = std::make_shared<SyncArgs>();
  CLI::App* recv = add_command(
      *sync, dispatch, "recv",
      "Join a session and receive rounds (per-tensor delivery, checksummed)",
      "ferry sync recv --address @job42 --id 0 --rounds 3", [rargs] { return run_recv(*rargs); });
  recv->add_option("--address", rargs->address, "Sender's address")->capture_default_str();
  recv->add_option("--id", rargs->id, "This receiver's id (unique in the session)")
      ->capture_default_str();
  recv->add_option("--rounds", rargs->rounds, "Rounds to receive")->capture_default_str();
  recv->add_option("--timeout", rargs->timeout_s, "Seconds to wait for the sender")
      ->capture_default_str();
  recv->add_flag("--json", rargs->json, "Print one JSON object per round");
}

}  // namespace ferry::cli

#include "tools/sync_demo.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <sstream>

#include "base/file_util.h"
#include "delta/training_update.h"
#include "ferry/model.h"
#include "ferry/sync.h"
#include "tools/child_process.h"
#include "tools/host_buffer.h"

namespace ferry::tools {
namespace {

std::vector<TensorSpec> demo_specs(const DemoConfig& c) {
  const std::int64_t h = c.hidden;
  return {*TensorSpec::make("model.embed_tokens.weight", DType::kF32, {c.vocab, h}),
          *TensorSpec::make("model.layers.0.input_layernorm.weight", DType::kF32, {h}),
          *TensorSpec::make("model.layers.0.self_attn.q_proj.weight", DType::kBF16, {h / 8, h}),
          *TensorSpec::make("model.layers.0.self_attn.q_proj.bias", DType::kBF16, {h / 8}),
          *TensorSpec::make("model.norm.weight", DType::kF32, {h})};
}

}  // namespace

Result<std::vector<DemoRound>> run_sync_demo(
    const DemoConfig& config, const std::function<void(double)>& on_ready,
    const std::function<void(const DemoRound&)>& on_round) {
  const auto setup_start = std::chrono::steady_clock::now();
  if (config.vocab <= 0 || config.hidden < 8 || config.hidden % 8 != 0 || config.receivers == 0 ||
      config.rounds <= 0 || config.bucket_mb == 0) {
    return invalid_argument(
        "demo: vocab > 0, hidden a multiple of 8, receivers, rounds and bucket_mb > 0");
  }
  const std::vector<TensorSpec> specs = demo_specs(config);
  std::uint64_t total = 0;
  for (const auto& s : specs) total += s.bytes();
  sync::SyncOptions o;
  o.bucket_bytes = config.bucket_mb << 20;
  if (config.delta) o.delta = sync::DeltaMode::kOn;
  const std::string address = fmt::format("@ferry-demo-{}", ::getpid());
  // Each receiver prints, per round, one line of tensor hashes.
  std::vector<Subprocess> kids;
  for (std::uint32_t id = 0; id < config.receivers; ++id) {
    auto kid = fork_child([&, id]() -> std::string {
      // Backed before joining (base/prefault.h): the sender starts round 1 once all have
      // joined, and first-touching 2.5 GB inside it made round 1 ~20x slower than round 2.
      auto dst = map_anonymous(total, false, /*prefault=*/true);
      if (!dst.ok()) return "error " + dst.status().to_string() + "\n";
      auto rx = sync::Receiver::connect(address, id, o);
      if (!rx.ok()) return "error " + rx.status().to_string() + "\n";
      std::vector<std::span<std::byte>> parts;
      std::uint64_t off = 0;
      for (const auto& s : specs) {
        parts.emplace_back(dst->data() + off, s.bytes());
        (void)(*rx)->set_destination({s, parts.back()});
        off += s.bytes();
      }
      std::string out;
      for (int r = 0; r < config.rounds; ++r) {
        auto got = (*rx)->receive_round_into();
        if (!got.ok()) return out + "error " + got.status().to_string() + "\n";
        for (const auto& p : parts) out += fmt::format("{:016x} ", XXH3_64bits(p.data(), p.size()));
        out += "\n";
      }
      return out;
    });
    if (!kid.ok()) return kid.status();
    kids.push_back(std::move(*kid));
  }
  profiler::Session* profile = nullptr;
  if (config.start_profile) {
    auto started = config.start_profile();
    if (!started.ok()) return started.status();
    profile = *started;
  }
  // Backed now, so filling it before round 1 is as fast as before later rounds.
  auto source = map_anonymous(total, true, /*prefault=*/true);
  if (!source.ok()) return source.status();
  const std::vector<TensorView> views = lay_out(specs, source->data());
  auto sender = sync::Sender::create(address, o);
  if (!sender.ok()) return sender.status();
  Status s = (*sender)->accept(config.receivers);
  if (!s.ok()) return s;
  if (on_ready) {
    on_ready(std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count());
  }
  std::vector<DemoRound> rounds;
  std::vector<std::string> want;  // per round, the sender's hashes
  if (profile != nullptr) profile->begin_step(1);
  for (int r = 0; r < config.rounds; ++r) {
    std::string line;
    for (std::size_t t = 0; t < specs.size(); ++t) {
      auto bytes = std::span<std::byte>(source->data() + (views[t].data.data() - source->data()),
                                        views[t].data.size());
      const std::uint64_t seed = config.seed + static_cast<std::uint64_t>(r);
      if (config.delta && r > 0) {
        const int bits = dtype_bits(specs[t].dtype);
        delta::change_elements(seed * 7919 + t, 0.01, static_cast<std::size_t>(bits / 8), bytes);
      } else {
        model::fill_synthetic(seed, specs[t].name, 0, bytes);
      }
      line += fmt::format("{:016x} ", XXH3_64bits(bytes.data(), bytes.size()));
    }
    want.push_back(line);
    if (profile != nullptr) profile->begin_task(fmt::format("sync round {}", r + 1));
    auto st = (*sender)->send_round(views);
    if (profile != nullptr) {
      if (auto files = profile->end_task(); !files.ok()) return files.status();
    }
    if (!st.ok()) return st.status();
    DemoRound d;
    d.round = st->round;
    d.bytes = st->bytes;
    d.buckets = st->buckets;
    d.tensors = st->tensors;
    d.seconds = st->seconds;
    d.delta = st->delta;
    d.wire_bytes = st->wire_bytes;
    d.largest_tensor_bytes = specs[0].bytes();
    if (on_round) on_round(d);  // receiver_ok is known only when the receivers exit
    rounds.push_back(d);
  }
  if (profile != nullptr) {
    if (auto files = profile->end_step(); !files.ok()) return files.status();
  }
  sender->reset();  // close the session so receivers exit
  for (Subprocess& k : kids) {
    auto out = finish_child(k);
    if (!out.ok()) return out.status();
    std::istringstream lines(*out);
    std::string line;
    for (DemoRound& d : rounds) {
      const bool got = static_cast<bool>(std::getline(lines, line));
      if (got && line.rfind("error", 0) == 0) return aborted("demo receiver: " + line);
      d.receiver_ok.push_back(got && line == want[d.round - 1]);
    }
  }
  return rounds;
}

}  // namespace ferry::tools

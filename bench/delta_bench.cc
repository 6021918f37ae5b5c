// delta_bench: the delta codec (docs/delta.md) on bf16 weights of a real model's shapes,
// against memcpy of the same bytes measured right before each row (docs/benchmarks.md, "Delta").
//
//   delta_bench [--preset qwen2.5-0.5b] [--mb N] [--densities 0.001,0.01,0.1,1.0]
//               [--choices auto,runs,xor_zstd,dense] [--zstd-level 1] [--reps 3] [--json]
//
// The weights are bf16 N(0, 0.02) (fp32 master weights rounded). Each case changes them:
// a density d changes round(d * elements) random bf16 elements (half by one ulp, half to
// random values); "adam" is one Adam step with lr 1e-6 (its measured density is printed).
// Each tensor is one segment, as a round would send it. --mb N keeps the first tensors up
// to N MiB (0: the whole model). Times are the best of --reps; encoded buffers are reused
// from one rep to the next (as a sender would keep them), so the best rep faults in no pages.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "delta/delta.h"
#include "delta/training_update.h"
#include "ferry/model.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace delta = ferry::delta;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "delta_bench: %s\n", what.c_str());
  std::exit(1);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Options {
  std::string preset = "qwen2.5-0.5b";
  std::uint64_t mb = 0;
  std::vector<double> densities = {0.001, 0.01, 0.1, 1.0};
  std::vector<delta::Choice> choices = {delta::Choice::kAuto, delta::Choice::kRuns,
                                        delta::Choice::kXorZstd, delta::Choice::kDense};
  int zstd_level = 1;
  int reps = 3;
  bool json = false;
};

const char* choice_name(delta::Choice c) {
  switch (c) {
    case delta::Choice::kAuto:
      return "auto";
    case delta::Choice::kDense:
      return "dense";
    case delta::Choice::kRuns:
      return "runs";
    case delta::Choice::kXorZstd:
      return "xor_zstd";
  }
  return "?";
}

std::optional<delta::Choice> choice_named(const std::string& name) {
  for (const delta::Choice c : {delta::Choice::kAuto, delta::Choice::kRuns, delta::Choice::kXorZstd,
                                delta::Choice::kDense}) {
    if (name == choice_name(c)) return c;
  }
  return std::nullopt;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= argc) die("missing value after " + k);
    const std::string v = argv[++i];
    if (k == "--preset") {
      o.preset = v;
    } else if (k == "--mb") {
      o.mb = std::stoull(v);
    } else if (k == "--zstd-level") {
      o.zstd_level = std::stoi(v);
    } else if (k == "--reps") {
      o.reps = std::max(1, std::stoi(v));
    } else if (k == "--choices") {
      o.choices.clear();
      for (std::size_t pos = 0; pos <= v.size();) {
        const std::size_t comma = std::min(v.find(',', pos), v.size());
        const auto c = choice_named(v.substr(pos, comma - pos));
        if (!c) die("--choices takes auto, runs, xor_zstd, dense: " + v);
        o.choices.push_back(*c);
        pos = comma + 1;
      }
    } else if (k == "--densities") {
      o.densities.clear();
      for (std::size_t pos = 0; pos <= v.size();) {
        const std::size_t comma = std::min(v.find(',', pos), v.size());
        const double d = std::stod(v.substr(pos, comma - pos));
        if (!(d > 0 && d <= 1)) die("a density must be in (0, 1]: " + v);
        o.densities.push_back(d);
        pos = comma + 1;
      }
    } else {
      die("unknown option " + k);
    }
  }
  return o;
}

struct Segment {
  std::size_t offset, bytes;
};

struct Row {
  std::string update, encoding;  // encoding: the choice ("auto" picks per segment)
  double density = 0;            // fraction of bf16 elements changed
  double encode_gbps = 0, apply_gbps = 0, encoded_ratio = 0;
  double memcpy_gbps = 0;  // memcpy of the same bytes, measured beside this row
  std::string picked;      // auto: how many segments took each encoding
};

double measure_memcpy(const std::vector<std::byte>& from, std::vector<std::byte>* to, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(to->data(), from.data(), from.size());
    best = std::min(best, seconds_since(t0));
  }
  return static_cast<double>(from.size()) / best / 1e9;
}

Row run_case(const std::string& update, double density, delta::Choice choice,
             const std::vector<Segment>& segments, const std::vector<std::byte>& previous,
             const std::vector<std::byte>& current, std::vector<std::byte>* destination,
             const Options& o) {
  Row row{update, choice_name(choice), density};
  // memcpy right before the row: on a shared machine the load drifts within one run.
  row.memcpy_gbps = measure_memcpy(current, destination, o.reps);
  const double total = static_cast<double>(current.size());
  std::vector<std::vector<std::byte>> encoded(segments.size());
  double encode_best = 1e30, apply_best = 1e30;
  std::size_t encoded_bytes = 0;
  int picked[3] = {0, 0, 0};
  for (int r = 0; r < o.reps; ++r) {
    encoded_bytes = 0;
    const auto t0 = Clock::now();
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const auto [offset, bytes] = segments[i];
      const ferry::Status s =
          delta::encode_into({previous.data() + offset, bytes}, {current.data() + offset, bytes},
                             {.choice = choice, .zstd_level = o.zstd_level}, &encoded[i]);
      if (!s.ok()) die(s.to_string());
      encoded_bytes += encoded[i].size();
    }
    encode_best = std::min(encode_best, seconds_since(t0));
    std::memcpy(destination->data(), previous.data(), previous.size());  // untimed
    const auto t1 = Clock::now();
    for (std::size_t i = 0; i < segments.size(); ++i) {
      const auto [offset, bytes] = segments[i];
      const ferry::Status s =
          delta::apply(encoded[i], {destination->data() + offset, bytes}, "bench");
      if (!s.ok()) die(s.to_string());
    }
    apply_best = std::min(apply_best, seconds_since(t1));
    if (std::memcmp(destination->data(), current.data(), current.size()) != 0) {
      die("apply did not reproduce the current bytes (" + update + ", " + row.encoding + ")");
    }
  }
  for (const auto& e : encoded) ++picked[static_cast<int>(e.at(5))];
  row.encode_gbps = total / encode_best / 1e9;
  row.apply_gbps = total / apply_best / 1e9;
  row.encoded_ratio = static_cast<double>(encoded_bytes) / total;
  if (choice == delta::Choice::kAuto) {
    row.picked = "dense " + std::to_string(picked[0]) + ", runs " + std::to_string(picked[1]) +
                 ", xor_zstd " + std::to_string(picked[2]);
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  auto config = ferry::model::preset(o.preset);
  if (!config.ok()) die(config.status().to_string());
  std::vector<Segment> segments;
  std::size_t total = 0;
  for (const auto& spec : ferry::model::hf_tensor_specs(*config, ferry::DType::kBF16)) {
    const std::size_t bytes = spec.bytes();
    if (o.mb != 0 && total + bytes > o.mb << 20) {
      if (total == 0) segments.push_back({0, o.mb << 20}), total = o.mb << 20;  // one part
      break;
    }
    segments.push_back({total, bytes});
    total += bytes;
  }
  std::vector<std::byte> previous(total), current(total), destination(total);
  const double adam_density = delta::adam_step_bf16(1, 1e-6, previous, current);

  const std::vector<delta::Choice>& choices = o.choices;
  std::vector<Row> rows;
  for (const delta::Choice c : choices) {
    rows.push_back(
        run_case("adam lr 1e-6", adam_density, c, segments, previous, current, &destination, o));
  }
  for (const double d : o.densities) {
    std::memcpy(current.data(), previous.data(), total);
    delta::change_elements(7, d, 2, current);
    const double measured = 1.0 - [&] {  // fraction of bf16 elements still equal
      std::size_t same = 0;
      for (std::size_t i = 0; i + 1 < total; i += 2) {
        same += previous[i] == current[i] && previous[i + 1] == current[i + 1];
      }
      return static_cast<double>(same) / static_cast<double>(total / 2);
    }();
    for (const delta::Choice c : choices) {
      rows.push_back(run_case("density " + std::to_string(d), measured, c, segments, previous,
                              current, &destination, o));
    }
  }

  if (o.json) {
    nlohmann::json j;
    j["preset"] = o.preset;
    j["bytes"] = total;
    j["segments"] = segments.size();
    j["zstd_level"] = o.zstd_level;
    for (const Row& r : rows) {
      j["rows"].push_back({{"update", r.update},
                           {"density", r.density},
                           {"encoding", r.encoding},
                           {"encode_gbps", r.encode_gbps},
                           {"apply_gbps", r.apply_gbps},
                           {"memcpy_gbps", r.memcpy_gbps},
                           {"encode_vs_memcpy", r.encode_gbps / r.memcpy_gbps},
                           {"apply_vs_memcpy", r.apply_gbps / r.memcpy_gbps},
                           {"encoded_vs_dense", r.encoded_ratio},
                           {"auto_picked", r.picked}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s bf16: %.1f MiB in %zu segments, zstd level %d, best of %d\n", o.preset.c_str(),
              static_cast<double>(total) / (1 << 20), segments.size(), o.zstd_level, o.reps);
  std::printf("%-16s %8s %-9s %9s %9s %9s %9s %9s %10s  %s\n", "update", "density", "encoding",
              "mcpy GB/s", "enc GB/s", "enc/mcpy", "app GB/s", "app/mcpy", "enc/dense",
              "auto picked");
  for (const Row& r : rows) {
    std::printf("%-16s %8.5f %-9s %9.2f %9.2f %9.3f %9.2f %9.3f %10.5f  %s\n", r.update.c_str(),
                r.density, r.encoding.c_str(), r.memcpy_gbps, r.encode_gbps,
                r.encode_gbps / r.memcpy_gbps, r.apply_gbps, r.apply_gbps / r.memcpy_gbps,
                r.encoded_ratio, r.picked.c_str());
  }
  return 0;
}

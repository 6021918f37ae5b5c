// ferry advise-bucket: verl's update_weights_bucket_megabytes, computed as the FAQ says.
#include <charconv>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "ferry/model.h"
#include "ferry/safetensors.h"

namespace ferry::cli {
namespace {

struct AdviseArgs {
  std::string path;
  std::string shape;
  std::string dtype = "float32";
  double margin = 1.2;
  bool json = false;
};

Result<std::vector<std::int64_t>> parse_shape(const std::string& text) {
  std::vector<std::int64_t> dims;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, 'x')) {
    std::int64_t v = -1;  // stays -1 when `part` is empty, not a number or out of range
    const char* end = part.data() + part.size();
    if (std::from_chars(part.data(), end, v).ptr != end || v < 0) {
      return invalid_argument("--shape '" + text + "': write dimensions as 151936x4096");
    }
    dims.push_back(v);
  }
  if (dims.empty()) return invalid_argument("--shape is empty: write dimensions as 151936x4096");
  return dims;
}

// The largest tensor of a model folder or file, or of --shape.
Result<TensorSpec> largest_tensor(const AdviseArgs& a) {
  if (!a.shape.empty()) {
    auto dims = parse_shape(a.shape);
    if (!dims.ok()) return dims.status();
    auto dtype = parse_dtype(a.dtype);
    if (!dtype.ok()) return dtype.status();
    return TensorSpec::make("--shape", *dtype, std::move(*dims));
  }
  auto index = read_model_index(a.path);  // headers only
  if (!index.ok()) return index.status();
  if (index->tensors.empty()) return invalid_argument(a.path + " holds no tensors");
  const TensorSpec* best = &index->tensors.front().entry.spec;
  for (const ModelTensor& t : index->tensors) {
    if (t.entry.spec.bytes() > best->bytes()) best = &t.entry.spec;
  }
  return *best;
}

int run_advise(const AdviseArgs& a) {
  if (!a.shape.empty()) {
    if (auto dims = parse_shape(a.shape); !dims.ok()) return usage_error(dims.status());
    if (auto dtype = parse_dtype(a.dtype); !dtype.ok()) return usage_error(dtype.status());
  }
  if (a.path.empty() == a.shape.empty()) {
    return usage_error("give a model folder or file, or --shape (not both)");
  }
  auto largest = largest_tensor(a);
  if (!largest.ok()) return report_error(largest.status());
  auto advice = model::advise_bucket(largest->bytes(), a.margin);
  if (!advice.ok()) return report_error(advice.status());
  if (a.json) {
    nlohmann::ordered_json j = {{"tensor", largest->name},
                                {"shape", largest->shape},
                                {"dtype", std::string(dtype_name(largest->dtype))},
                                {"bytes", advice->largest_bytes},
                                {"mb", advice->largest_mb},
                                {"margin", advice->margin},
                                {"bucket_mb", advice->bucket_mb},
                                {"bucket_memory_bytes", advice->bucket_mb << 20},
                                {"override", advice->override_line},
                                {"ferry_needs_setting", false}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  // verl's "megabytes" are 2^20 bytes (bucket_megabytes << 20): printed as MiB.
  std::printf("largest tensor:     %s\n", largest->to_string().c_str());
  std::printf("size:               %.1f MiB (%llu bytes; MiB = bytes / 2^20)\n", advice->largest_mb,
              static_cast<unsigned long long>(advice->largest_bytes));
  std::printf("recommended bucket: %llu MiB (largest x %.2f, rounded up to a power of two)\n",
              static_cast<unsigned long long>(advice->bucket_mb), advice->margin);
  std::printf(
      "memory cost:        %llu MiB of shared memory per sender, allocated each round in "
      "verl's shm mode\n",
      static_cast<unsigned long long>(advice->bucket_mb));
  std::printf("verl override:\n  %s\n", advice->override_line.c_str());
  std::printf(
      "ferry's own engine needs no such setting: a tensor larger than its bucket streams "
      "through the bucket in pieces.\n");
  return kExitOk;
}

}  // namespace

void add_advise_bucket_command(CLI::App& app, Dispatch& dispatch) {
  auto args = std::make_shared<AdviseArgs>();
  CLI::App* cmd = add_command(
      app, dispatch, "advise-bucket",
      "Recommend verl's update_weights_bucket_megabytes for a model (reads headers only)",
      "ferry advise-bucket --shape 151936x4096 --dtype float32\n  ferry advise-bucket "
      "/models/qwen2.5-7b",
      [args] { return run_advise(*args); });
  cmd->add_option("path", args->path, "Model folder or .safetensors file");
  cmd->add_option("--shape", args->shape, "A tensor shape instead of a model, e.g. 151936x4096");
  cmd->add_option("--dtype", args->dtype, "dtype of --shape (float32, bf16, ...)")
      ->capture_default_str();
  cmd->add_option("--margin", args->margin, "Head-room factor over the largest tensor")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print JSON");
}

}  // namespace ferry::cli

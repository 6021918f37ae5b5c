// ferry gen-model: a synthetic Hugging Face model folder with real shapes.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "ferry/model.h"
#include "ferry/safetensors.h"

namespace ferry::cli {
namespace {

struct GenModelArgs {
  std::string preset;
  std::string out;
  std::string dtype = "bf16";
  std::int64_t layers = 0;
  CLI::Option* layers_option = nullptr;  // given or not: there is no "all layers" number
  std::uint64_t seed = 0;
  double max_shard_gb = 5.0;
  bool force = false;
  bool json = false;
};

int run_gen_model(const GenModelArgs& a) {
  auto config = model::preset(a.preset);
  if (!config.ok()) return usage_error(config.status());
  auto dtype = parse_dtype(a.dtype);
  if (!dtype.ok()) return usage_error(dtype.status());
  if (*dtype != DType::kBF16 && *dtype != DType::kF16 && *dtype != DType::kF32) {
    return usage_error("--dtype must be bf16, fp16 or fp32, not " + a.dtype);
  }
  if (a.layers_option->count() > 0) {
    if (a.layers < 1 || a.layers > config->num_layers) {
      return usage_error(fmt::format("--layers {}: {} has 1..{} layers", a.layers, config->name,
                                     config->num_layers));
    }
    config->num_layers = a.layers;
  }
  std::error_code ec;
  if (std::filesystem::exists(a.out, ec) && !std::filesystem::is_empty(a.out, ec) && !a.force) {
    return report_error(already_exists("--out " + a.out +
                                       " exists and is not empty; pass --force to write into it"));
  }
  model::GenerateOptions options;
  options.dtype = *dtype;
  options.seed = a.seed;
  options.max_shard_bytes = static_cast<std::uint64_t>(a.max_shard_gb * 1e9);
  ProgressBar bar("gen-model " + config->name);
  options.progress = [&bar](std::uint64_t done, std::uint64_t total) { bar.update(done, total); };
  if (Status s = model::generate_model_folder(*config, a.out, options); !s.ok()) {
    return report_error(s);
  }
  auto index = read_model_index(a.out);
  if (!index.ok()) return report_error(index.status());
  std::uint64_t bytes = 0;
  for (const ModelTensor& t : index->tensors) bytes += t.entry.spec.bytes();
  if (a.json) {
    nlohmann::ordered_json j = {{"folder", a.out},
                                {"preset", config->name},
                                {"dtype", std::string(dtype_name(*dtype))},
                                {"layers", config->num_layers},
                                {"tensors", index->tensors.size()},
                                {"bytes", bytes},
                                {"files", index->files}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("wrote %s: %s, %lld layers, %zu tensors, %s in %zu file(s)\n", a.out.c_str(),
                config->name.c_str(), static_cast<long long>(config->num_layers),
                index->tensors.size(), format_bytes(bytes).c_str(), index->files.size());
  }
  return kExitOk;
}

}  // namespace

void add_gen_model_command(CLI::App& app, Dispatch& dispatch) {
  auto args = std::make_shared<GenModelArgs>();
  std::string presets;
  for (const std::string& p : model::preset_names()) presets += (presets.empty() ? "" : ", ") + p;
  CLI::App* cmd = add_command(
      app, dispatch, "gen-model",
      "Write a synthetic Hugging Face model folder (config.json, sharded safetensors, index) "
      "with the real tensor shapes of a named model and deterministic contents",
      "ferry gen-model --preset qwen2.5-7b --layers 2 --dtype bf16 --out /tmp/qwen7b",
      [args] { return run_gen_model(*args); });
  cmd->add_option("--preset", args->preset, "Model shapes: " + presets)->required();
  cmd->add_option("--out", args->out, "Folder to write (must be empty unless --force)")->required();
  cmd->add_option("--dtype", args->dtype, "bf16, fp16 or fp32")->capture_default_str();
  args->layers_option =
      cmd->add_option("--layers", args->layers,
                      "Keep the per-layer shapes but write only this many layers (default: all)");
  cmd->add_option("--seed", args->seed, "Seed of the deterministic contents")
      ->capture_default_str();
  cmd->add_option("--max-shard-gb", args->max_shard_gb,
                  "Start a new shard past this size, in GB = 10^9 bytes (as Hugging Face's "
                  "max_shard_size \"5GB\")")
      ->capture_default_str();
  cmd->add_flag("--force", args->force, "Write into a non-empty --out folder");
  cmd->add_flag("--json", args->json, "Print a JSON summary");
}

}  // namespace ferry::cli

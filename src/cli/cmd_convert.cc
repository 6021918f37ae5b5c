// ferry convert: Hugging Face <-> Megatron-core safetensors folders.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/progress.h"
#include "ferry/convert.h"

namespace ferry::cli {
namespace {

struct ConvertArgs {
  std::string from;
  std::string to;
  int tp = 1;
  std::string norms = "fused";
  std::int64_t padded_vocab = 0;
  double max_shard_gb = 5.0;
  bool check = false;
  bool force = false;
  bool json = false;
  std::string src;
  std::string dst;
  CLI::Option* tp_option = nullptr;
};

nlohmann::ordered_json groups_json(const std::vector<convert::NameGroup>& groups) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const convert::NameGroup& g : groups) {
    out.push_back({{"pattern", g.pattern}, {"layers", g.layers}});
  }
  return out;
}

int print_check(const std::vector<convert::CheckReport>& reports, bool json) {
  bool ok = true;
  for (const convert::CheckReport& r : reports) ok = ok && r.ok();
  if (json) {
    nlohmann::ordered_json doc = {{"ok", ok}, {"reports", nlohmann::ordered_json::array()}};
    for (const convert::CheckReport& r : reports) {
      doc["reports"].push_back({{"source", r.source},
                                {"ok", r.ok()},
                                {"missing", groups_json(r.missing)},
                                {"unexpected", groups_json(r.unexpected)},
                                {"bad_tensors", r.bad_tensors},
                                {"causes", r.causes}});
    }
    std::cout << doc.dump(2) << "\n";
  } else {
    for (const convert::CheckReport& r : reports) std::printf("%s\n", r.to_string().c_str());
  }
  return ok ? kExitOk : kExitFailure;
}

int run_convert(const ConvertArgs& a) {
  const bool to_megatron = a.from == "hf" && a.to == "megatron";
  const bool to_hf = a.from == "megatron" && a.to == "hf";
  if (!to_megatron && !to_hf) {
    return usage_error(
        invalid_argument("--from/--to must be 'hf'/'megatron' or 'megatron'/'hf', not '" + a.from +
                         "'/'" + a.to + "'"));
  }
  if (to_hf && a.tp_option->count() > 0) {
    return usage_error(invalid_argument(
        "--tp applies to --to megatron; a Megatron folder's TP size is read from its " +
        std::string(convert::kLayoutFileName)));
  }
  auto norms = convert::parse_norm_layout(a.norms);
  if (!norms.ok()) return usage_error(norms.status());
  convert::ConvertOptions options;
  options.layout = {.tp = a.tp, .norms = *norms, .padded_vocab_size = a.padded_vocab};
  if (a.check) {
    auto reports = to_megatron ? convert::check_hf_folder(a.src, options.layout)
                               : convert::check_megatron_folder(a.src);
    if (!reports.ok()) return report_error(reports.status());
    return print_check(*reports, a.json);
  }
  if (a.dst.empty()) return usage_error("DST is required unless --check");
  options.overwrite = a.force;
  options.max_shard_bytes = static_cast<std::uint64_t>(a.max_shard_gb * 1e9);
  ProgressBar bar("convert " + a.from + " -> " + a.to);
  options.progress = [&bar](std::uint64_t done, std::uint64_t total) { bar.update(done, total); };
  auto summary = to_megatron ? convert::hf_to_megatron(a.src, a.dst, options)
                             : convert::megatron_to_hf(a.src, a.dst, options);
  if (!summary.ok()) return report_error(summary.status());
  if (a.json) {
    nlohmann::ordered_json doc = {{"from", a.from},
                                  {"to", a.to},
                                  {"src", a.src},
                                  {"dst", a.dst},
                                  {"tensors_in", summary->tensors_in},
                                  {"tensors_out", summary->tensors_out},
                                  {"bytes", summary->bytes_out},
                                  {"files", summary->files}};
    if (to_megatron) doc["tp"] = a.tp;
    std::cout << doc.dump(2) << "\n";
  } else {
    std::printf("wrote %s: %zu tensors, %s in %zu file(s)\n", a.dst.c_str(), summary->tensors_out,
                format_bytes(summary->bytes_out).c_str(), summary->files.size());
  }
  return kExitOk;
}

}  // namespace

void add_convert_command(CLI::App& app, Dispatch& dispatch) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = add_command(
      app, dispatch, "convert",
      "Convert model weights between Hugging Face and Megatron-core (TP shards, fused QKV and "
      "gate/up) safetensors folders; Llama 3, Qwen2/2.5 and Qwen3 dense. Names and shapes are "
      "checked against config.json first, and every problem is listed at once",
      "ferry convert --from hf --to megatron --tp 2 /models/qwen3-8b /ckpt/qwen3-8b-tp2\n"
      "  ferry convert --from megatron --to hf /ckpt/qwen3-8b-tp2 /models/back\n"
      "  ferry convert --from megatron --to hf --check /ckpt/qwen3-8b-tp2",
      [args] { return run_convert(*args); });
  cmd->add_option("--from", args->from, "Source format: hf or megatron")->required();
  cmd->add_option("--to", args->to, "Destination format: megatron or hf")->required();
  args->tp_option = cmd->add_option("--tp", args->tp, "Tensor-parallel size (--to megatron)")
                        ->capture_default_str()
                        ->check(CLI::Range(1, 4096));
  cmd->add_option("--norms", args->norms,
                  "Megatron norm names: fused (Transformer Engine spec: "
                  "linear_qkv/linear_fc1.layer_norm_weight) or separate (local spec: "
                  "input_layernorm/pre_mlp_layernorm)")
      ->capture_default_str();
  cmd->add_option("--padded-vocab", args->padded_vocab,
                  "Megatron embedding rows incl. padding (default: vocab_size)");
  cmd->add_option("--max-shard-gb", args->max_shard_gb,
                  "HF output: start a new shard past this size")
      ->capture_default_str();
  cmd->add_flag("--check", args->check,
                "Only check names and shapes of SRC against config.json; write nothing");
  cmd->add_flag("--force", args->force, "Write into a non-empty DST");
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->add_option("SRC", args->src, "Source folder")->required();
  cmd->add_option("DST", args->dst, "Destination folder (not with --check)");
}

}  // namespace ferry::cli

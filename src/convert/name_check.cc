// Missing and unexpected names, folded per layer, with the likely cause.
#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "base/parse_number.h"
#include "ferry/convert.h"

namespace ferry::convert {
namespace {

// "decoder.layers.12.mlp.linear_fc1.weight" -> ("decoder.layers.N.mlp.linear_fc1.weight", 12).
std::pair<std::string, std::int64_t> fold_layer(std::string_view name) {
  constexpr std::string_view kLayers = "layers.";
  const std::size_t at = name.find(kLayers);
  if (at == std::string_view::npos) return {std::string(name), -1};
  std::size_t i = at + kLayers.size(), j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j - i > 9 || (j < name.size() && name[j] != '.')) return {std::string(name), -1};
  const std::int64_t layer = parse_uint(name.substr(i, j - i)).value_or(-1);
  return {std::string(name.substr(0, i)) + "N" + std::string(name.substr(j)), layer};
}

std::vector<NameGroup> group(const std::vector<std::string>& names) {
  std::map<std::string, std::set<std::int64_t>> by_pattern;
  std::vector<std::string> order;
  for (const std::string& n : names) {
    auto [pattern, layer] = fold_layer(n);
    if (!by_pattern.contains(pattern)) order.push_back(pattern);
    if (layer >= 0)
      by_pattern[pattern].insert(layer);
    else
      by_pattern[pattern];
  }
  std::vector<NameGroup> out;
  for (const std::string& p : order) {
    const auto& layers = by_pattern[p];
    out.push_back(NameGroup{p, std::vector<std::int64_t>(layers.begin(), layers.end())});
  }
  return out;
}

// "0-23" or "0, 3, 5-7".
std::string layer_ranges(const std::vector<std::int64_t>& layers) {
  std::string out;
  for (std::size_t i = 0; i < layers.size();) {
    std::size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(layers[i]);
    if (j > i) out += "-" + std::to_string(layers[j]);
    i = j + 1;
  }
  return out;
}

std::string describe(const NameGroup& g, bool missing) {
  if (g.layers.empty()) return std::string(missing ? "missing: " : "unexpected: ") + g.pattern;
  const std::size_t n = g.layers.size();
  return std::to_string(n) + (n == 1 ? " layer " : " layers ") +
         (missing ? (n == 1 ? "lacks " : "lack ")
                  : (n == 1 ? "has unexpected " : "have unexpected ")) +
         g.pattern + " (layers " + layer_ranges(g.layers) + ")";
}

bool any_contains(const std::vector<NameGroup>& groups, std::string_view part) {
  return std::any_of(groups.begin(), groups.end(),
                     [&](const NameGroup& g) { return g.pattern.find(part) != std::string::npos; });
}

bool any_starts(std::span<const TensorSpec> found, std::string_view prefix) {
  return std::any_of(found.begin(), found.end(),
                     [&](const TensorSpec& t) { return t.name.starts_with(prefix); });
}

void add_causes(const Mapping& m, CheckReport* r, std::span<const TensorSpec> found) {
  const model::ModelConfig& c = m.config;
  const bool meg = r->side == Side::kMegatron;
  const auto& miss = r->missing;
  const auto& extra = r->unexpected;
  const std::string family = "config.json's model_type is '" + c.family + "'";

  if (meg && any_starts(found, "model.")) {
    r->causes.push_back("the files hold Hugging Face names (model.*): convert with --from hf");
  }
  if (!meg && (any_starts(found, "decoder.") || any_starts(found, "embedding."))) {
    r->causes.push_back(
        "the files hold Megatron-core names (decoder.*): convert with --from megatron");
  }
  const std::string_view qn = meg ? "q_layernorm" : "q_norm";
  const std::string_view kn = meg ? "k_layernorm" : "k_norm";
  if (any_contains(miss, qn) || any_contains(miss, kn)) {
    std::string cause = family + " (per-head q/k RMSNorm) but the checkpoint has no " +
                        std::string(qn) + "/" + std::string(kn) +
                        ": either it is not a Qwen3 model (fix model_type in config.json)";
    if (meg) {
      cause +=
          ", or it was written by a Megatron-core / MindSpeed build without "
          "qk_layernorm support (verl's NPU FAQ: switch MindSpeed to 2.3.0_core_r0.12.1)";
    }
    r->causes.push_back(cause);
  }
  if (any_contains(extra, qn) || any_contains(extra, kn)) {
    r->causes.push_back("the checkpoint has per-head q/k norms but " + family +
                        ": it is likely a Qwen3 model (model_type qwen3)");
  }
  const std::string_view bias = meg ? "linear_qkv.bias" : "_proj.bias";
  if (any_contains(miss, bias)) {
    r->causes.push_back(family +
                        ", whose q/k/v projections have biases (Qwen2, or attention_bias "
                        "true), but the checkpoint has none: it is likely a Llama or Qwen3 model");
  }
  if (any_contains(extra, bias)) {
    r->causes.push_back("the checkpoint has q/k/v biases but " + family +
                        " without attention_bias: it is likely a Qwen2/Qwen2.5 model");
  }
  const std::string_view head = meg ? "output_layer." : "lm_head.";
  if (any_contains(miss, head)) {
    r->causes.push_back("config.json has tie_word_embeddings = false but there is no " +
                        std::string(head) +
                        "weight: the model is likely tied (set "
                        "tie_word_embeddings to true)");
  }
  if (any_contains(extra, head)) {
    r->causes.push_back(
        "config.json has tie_word_embeddings = true but the checkpoint has its "
        "own " +
        std::string(head) + "weight: set tie_word_embeddings to false");
  }
  if (meg) {
    const bool fused = m.layout.norms == NormLayout::kFused;
    if (fused && any_contains(miss, "layer_norm_weight") &&
        (any_contains(extra, "input_layernorm") || any_contains(extra, "pre_mlp_layernorm"))) {
      r->causes.push_back(
          "the checkpoint keeps its norms apart (input_layernorm / "
          "pre_mlp_layernorm: Megatron-core local spec), not fused into "
          "linear_qkv / linear_fc1 (Transformer Engine spec): use --norms separate");
    }
    if (!fused && any_contains(extra, "layer_norm_weight")) {
      r->causes.push_back(
          "the checkpoint fuses its norms into linear_qkv / linear_fc1 "
          "(Transformer Engine spec): use --norms fused");
    }
  }
  // Layers past num_hidden_layers, or whole layers absent.
  std::int64_t max_extra = -1;
  for (const NameGroup& g : extra) {
    if (!g.layers.empty()) max_extra = std::max(max_extra, g.layers.back());
  }
  if (max_extra >= c.num_layers) {
    r->causes.push_back("the checkpoint has layers up to " + std::to_string(max_extra) +
                        " but config.json has num_hidden_layers = " + std::to_string(c.num_layers));
  }
  std::set<std::int64_t> present_layers;
  for (const TensorSpec& t : found) {
    const auto layer = fold_layer(t.name).second;
    if (layer >= 0) present_layers.insert(layer);
  }
  if (!present_layers.empty() && *present_layers.rbegin() + 1 < c.num_layers &&
      !any_starts(found, meg ? "model." : "decoder.")) {
    r->causes.push_back("config.json has num_hidden_layers = " + std::to_string(c.num_layers) +
                        " but the checkpoint stops at layer " +
                        std::to_string(*present_layers.rbegin()) +
                        " (truncated, or one pipeline stage only)");
  }
  if (r->causes.empty() && (!miss.empty() || !extra.empty())) {
    r->causes.push_back("the names do not match the " + c.family +
                        " mapping: check model_type in config.json and the Megatron layout");
  }
}

}  // namespace

CheckReport check_tensors(const Mapping& m, Side side, std::span<const TensorSpec> found,
                          std::string source) {
  CheckReport r;
  r.side = side;
  r.source = std::move(source);
  std::vector<TensorSpec> expected = side == Side::kHf ? m.hf_tensors : m.shard_specs();
  std::map<std::string, const TensorSpec*> have;
  for (const TensorSpec& t : found) have.emplace(t.name, &t);
  std::set<std::string> wanted;
  std::vector<std::string> missing, unexpected;
  for (const TensorSpec& want : expected) {
    wanted.insert(want.name);
    auto it = have.find(want.name);
    if (it == have.end()) {
      missing.push_back(want.name);
      continue;
    }
    const TensorSpec& got = *it->second;
    if (got.shape != want.shape) {
      r.bad_tensors.push_back(
          want.name + ": shape " + got.shape_string() + " in the file, " + want.shape_string() +
          " from config.json" +
          (side == Side::kMegatron ? " at tp = " + std::to_string(m.layout.tp) : std::string()));
    } else if (got.dtype != want.dtype) {
      r.bad_tensors.push_back(want.name + ": dtype " + std::string(dtype_name(got.dtype)) +
                              ", but the model is " + std::string(dtype_name(want.dtype)) +
                              " (fused tensors need one dtype)");
    }
  }
  for (const TensorSpec& t : found) {
    if (!wanted.contains(t.name)) unexpected.push_back(t.name);
  }
  r.missing = group(missing);
  r.unexpected = group(unexpected);
  add_causes(m, &r, found);
  if (r.missing.empty() && r.unexpected.empty()) r.causes.clear();
  return r;
}

std::string CheckReport::to_string() const {
  if (ok())
    return (source.empty() ? std::string("tensors") : source) + ": all names and shapes match";
  std::string out = (source.empty() ? std::string("tensors") : source) + " (" +
                    (side == Side::kHf ? "Hugging Face" : "Megatron-core") +
                    " names) do not match config.json:";
  for (const NameGroup& g : missing) out += "\n  " + describe(g, true);
  for (const NameGroup& g : unexpected) out += "\n  " + describe(g, false);
  constexpr std::size_t kMaxLines = 20;
  for (std::size_t i = 0; i < bad_tensors.size() && i < kMaxLines; ++i) {
    out += "\n  " + bad_tensors[i];
  }
  if (bad_tensors.size() > kMaxLines) {
    out += "\n  ... and " + std::to_string(bad_tensors.size() - kMaxLines) + " more mismatches";
  }
  for (const std::string& c : causes) out += "\n  likely cause: " + c;
  return out;
}

Status CheckReport::to_status() const {
  if (ok()) return ok_status();
  return missing.empty() ? failed_precondition(to_string()) : not_found(to_string());
}

}  // namespace ferry::convert

// Shapes of real Hugging Face checkpoints, from each model's config.json.
#include <algorithm>
#include <cctype>
#include <string>

#include "ferry/model.h"
#include "model/family.h"

namespace ferry::model {
namespace {

struct Preset {
  const char* name;
  const char* family;
  std::int64_t vocab, hidden, layers, heads, kv_heads, head_dim, intermediate;
  bool tied;
  double eps, rope_theta;
  std::int64_t max_positions;
};

// head_dim 0 means hidden / heads (Qwen2, Llama); Qwen3 sets it explicitly.
constexpr Preset kPresets[] = {
    {"qwen2.5-0.5b", "qwen2", 151936, 896, 24, 14, 2, 0, 4864, true, 1e-6, 1e6, 32768},
    {"qwen2.5-1.5b", "qwen2", 151936, 1536, 28, 12, 2, 0, 8960, true, 1e-6, 1e6, 32768},
    {"qwen2.5-7b", "qwen2", 152064, 3584, 28, 28, 4, 0, 18944, false, 1e-6, 1e6, 131072},
    {"qwen2.5-14b", "qwen2", 152064, 5120, 48, 40, 8, 0, 13824, false, 1e-6, 1e6, 131072},
    {"qwen2.5-72b", "qwen2", 152064, 8192, 80, 64, 8, 0, 29568, false, 1e-6, 1e6, 131072},
    {"qwen3-0.6b", "qwen3", 151936, 1024, 28, 16, 8, 128, 3072, true, 1e-6, 1e6, 40960},
    {"qwen3-8b", "qwen3", 151936, 4096, 36, 32, 8, 128, 12288, false, 1e-6, 1e6, 40960},
    {"qwen3-32b", "qwen3", 151936, 5120, 64, 64, 8, 128, 25600, false, 1e-6, 1e6, 40960},
    {"llama3-8b", "llama", 128256, 4096, 32, 32, 8, 0, 14336, false, 1e-5, 500000, 8192},
    {"llama3-70b", "llama", 128256, 8192, 80, 64, 8, 0, 28672, false, 1e-5, 500000, 8192},
};

std::string normalize(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '_' || c == ' ') continue;
    out += static_cast<char>(std::tolower(u));
  }
  // Accept "llama-3-8b", "meta-llama-3-8b" and "qwen/qwen2.5-7b" spellings.
  if (const auto slash = out.rfind('/'); slash != std::string::npos) out.erase(0, slash + 1);
  if (out.starts_with("meta-")) out.erase(0, 5);
  if (out.starts_with("llama-3")) out.erase(5, 1);
  return out;
}

}  // namespace

std::string architecture_for(std::string_view family) {
  if (family == "qwen2") return "Qwen2ForCausalLM";
  if (family == "qwen3") return "Qwen3ForCausalLM";
  return "LlamaForCausalLM";
}

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

Result<ModelConfig> preset(std::string_view name) {
  const std::string key = normalize(name);
  for (const Preset& p : kPresets) {
    if (key != p.name) continue;
    ModelConfig c;
    c.name = p.name;
    c.family = p.family;
    c.architecture = architecture_for(p.family);
    c.vocab_size = p.vocab;
    c.hidden_size = p.hidden;
    c.num_layers = p.layers;
    c.num_heads = p.heads;
    c.num_kv_heads = p.kv_heads;
    c.head_dim = p.head_dim ? p.head_dim : p.hidden / p.heads;
    c.intermediate_size = p.intermediate;
    c.tie_word_embeddings = p.tied;
    c.qkv_bias = c.family == "qwen2";
    c.qk_norm = c.family == "qwen3";
    c.rms_norm_eps = p.eps;
    c.rope_theta = p.rope_theta;
    c.max_position_embeddings = p.max_positions;
    return c;
  }
  std::string names;
  for (const Preset& p : kPresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  return invalid_argument("unknown model preset '" + std::string(name) + "'; presets: " + names);
}

}  // namespace ferry::model

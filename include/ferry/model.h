// Model shapes: named presets of real Hugging Face architectures, the tensor
// list they imply, synthetic model folders, and bucket sizing advice.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::model {

// The parts of a Hugging Face config.json that fix tensor names and shapes.
struct ModelConfig {
  std::string name;          // preset name, e.g. "qwen2.5-7b" ("" when read from a folder)
  std::string family;        // "qwen2", "qwen3" or "llama" (config.json's model_type)
  std::string architecture;  // "Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM"
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;  // hidden_size / num_heads unless the family sets it (Qwen3)
  std::int64_t intermediate_size = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: q/k/v projections have biases
  bool qk_norm = false;   // Qwen3: per-head q_norm / k_norm
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::int64_t max_position_embeddings = 32768;
};

// Names accepted by preset(), in a stable order.
FERRY_EXPORT std::vector<std::string> preset_names();
// "qwen2.5-7b", "llama3-8b", ... (case-insensitive; the error lists the names).
FERRY_EXPORT Result<ModelConfig> preset(std::string_view name);

// Parses config.json text; errors name the missing or malformed field.
FERRY_EXPORT Result<ModelConfig> parse_hf_config(std::string_view json_text,
                                                 std::string_view source);
// config.json text for `config` saved in `dtype` (torch_dtype).
FERRY_EXPORT std::string hf_config_json(const ModelConfig& config, DType dtype);

// Every tensor of the Hugging Face checkpoint, in the order HF writes them
// (embedding, layers in order, final norm, lm_head unless tied).
FERRY_EXPORT std::vector<TensorSpec> hf_tensor_specs(const ModelConfig& config, DType dtype);

// Deterministic contents: the same (seed, name) always gives the same bytes,
// whatever the piece boundaries. Fills `out` with the bytes at
// [offset, offset + out.size()) of tensor `name`.
FERRY_EXPORT void fill_synthetic(std::uint64_t seed, std::string_view name, std::uint64_t offset,
                                 std::span<std::byte> out);

struct GenerateOptions {
  DType dtype = DType::kBF16;
  std::uint64_t seed = 0;
  // Shards close once they pass this size (HF's default max_shard_size is 5 GB).
  std::uint64_t max_shard_bytes = 5'000'000'000ULL;
  // Called with (bytes written so far, bytes in total); may be empty.
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

// Writes config.json, sharded safetensors and model.safetensors.index.json
// into `folder` (created if missing). Each file appears atomically.
FERRY_EXPORT Status generate_model_folder(const ModelConfig& config, const std::string& folder,
                                          const GenerateOptions& options);

// verl's bucket setting, computed as its FAQ says: the largest tensor in MB
// (bytes / 1024^2) times a margin, rounded up to a power of two.
struct BucketAdvice {
  std::uint64_t largest_bytes = 0;
  double largest_mb = 0;
  double margin = 1.2;
  std::uint64_t bucket_mb = 0;  // the recommendation
  // "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=N"
  std::string override_line;
};
inline constexpr std::string_view kVerlBucketKey =
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes";
FERRY_EXPORT Result<BucketAdvice> advise_bucket(std::uint64_t largest_bytes, double margin = 1.2);

}  // namespace ferry::model

// Small in-memory models for the convert tests.
#pragma once

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ferry/convert.h"
#include "ferry/model.h"

namespace ferry::convert::testing {

using Bytes = std::vector<std::byte>;

// A tiny model of `family` whose sizes divide by tp = 1, 2 and 4.
inline model::ModelConfig tiny_config(const std::string& family, bool tied = false) {
  model::ModelConfig c;
  c.family = family;
  c.architecture = family == "qwen2"   ? "Qwen2ForCausalLM"
                   : family == "qwen3" ? "Qwen3ForCausalLM"
                                       : "LlamaForCausalLM";
  c.vocab_size = 100;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = family == "qwen3" ? 8 : 4;  // Qwen3 sets head_dim apart from hidden / heads
  c.intermediate_size = 48;
  c.tie_word_embeddings = tied;
  c.qkv_bias = family == "qwen2";
  c.qk_norm = family == "qwen3";
  return c;
}

// Deterministic bytes for every HF tensor of `m`.
inline std::map<std::string, Bytes> synthetic_hf(const Mapping& m, std::uint64_t seed = 7) {
  std::map<std::string, Bytes> out;
  for (const TensorSpec& t : m.hf_tensors) {
    Bytes b(t.bytes());
    model::fill_synthetic(seed, t.name, 0, b);
    out[t.name] = std::move(b);
  }
  return out;
}

// Rank `rank`'s shard of `p`, built by copying along shard_runs (zeros for padding).
inline Bytes build_shard(const Mapping& m, const MegatronParam& p, int rank,
                         const std::map<std::string, Bytes>& hf) {
  Bytes shard(m.shard_spec(p).bytes());
  for (const Run& r : shard_runs(m, p, rank)) {
    if (r.source == Run::kZeros) continue;
    const Bytes& src = hf.at(p.hf_names[static_cast<std::size_t>(r.source)]);
    for (std::uint64_t b = 0; b < r.count; ++b) {
      std::memcpy(shard.data() + r.shard_offset + b * r.block_bytes,
                  src.data() + r.hf_offset + b * r.hf_stride, r.block_bytes);
    }
  }
  return shard;
}

}  // namespace ferry::convert::testing

// The HF <-> Megatron-core name and shape correspondence (docs/convert.md has the table and
// the source it was checked against).
#include <string>

#include "ferry/convert.h"

namespace ferry::convert {
namespace {

std::string layer_prefix(std::int64_t i) { return "decoder.layers." + std::to_string(i) + "."; }
std::string hf_prefix(std::int64_t i) { return "model.layers." + std::to_string(i) + "."; }

Status divisible(std::int64_t value, const char* field, int tp) {
  if (value % tp == 0) return ok_status();
  return invalid_argument(std::string(field) + " = " + std::to_string(value) +
                          " is not divisible by the tensor-parallel size " + std::to_string(tp) +
                          " (Megatron-core splits it evenly across TP ranks)");
}

}  // namespace

std::string_view norm_layout_name(NormLayout layout) {
  return layout == NormLayout::kFused ? "fused" : "separate";
}

Result<NormLayout> parse_norm_layout(std::string_view text) {
  if (text == "fused" || text == "te") return NormLayout::kFused;
  if (text == "separate" || text == "local") return NormLayout::kSeparate;
  return invalid_argument("norm layout '" + std::string(text) +
                          "' is unknown; expected 'fused' (Transformer Engine spec) or "
                          "'separate' (Megatron-core local spec)");
}

std::string_view split_kind_name(SplitKind kind) {
  switch (kind) {
    case SplitKind::kReplicated:
      return "replicated";
    case SplitKind::kColumn:
      return "column";
    case SplitKind::kRow:
      return "row";
    case SplitKind::kQkv:
      return "qkv";
    case SplitKind::kGateUp:
      return "gate_up";
  }
  return "?";
}

const MegatronParam* Mapping::find_param(std::string_view name) const {
  auto it = param_index_.find(std::string(name));
  return it == param_index_.end() ? nullptr : &params[it->second];
}

std::ptrdiff_t Mapping::find_hf(std::string_view name) const {
  auto it = hf_index_.find(std::string(name));
  return it == hf_index_.end() ? -1 : static_cast<std::ptrdiff_t>(it->second);
}

TensorSpec Mapping::shard_spec(const MegatronParam& param) const {
  return TensorSpec{param.name, dtype, param.shard_shape};
}

std::vector<TensorSpec> Mapping::shard_specs() const {
  std::vector<TensorSpec> out;
  out.reserve(params.size());
  for (const MegatronParam& p : params) out.push_back(shard_spec(p));
  return out;
}

Result<Mapping> build_mapping(const model::ModelConfig& c, const MegatronLayout& layout,
                              DType dtype) {
  if (c.family != "llama" && c.family != "qwen2" && c.family != "qwen3") {
    return invalid_argument("model family '" + c.family +
                            "' has no Megatron-core mapping (supported: llama, qwen2, qwen3)");
  }
  if (c.num_layers <= 0 || c.hidden_size <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 ||
      c.head_dim <= 0 || c.intermediate_size <= 0 || c.vocab_size <= 0) {
    return invalid_argument(
        "model config has a non-positive size (num_hidden_layers, "
        "hidden_size, num_attention_heads, num_key_value_heads, head_dim, "
        "intermediate_size and vocab_size must all be positive)");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return invalid_argument(
        "num_attention_heads = " + std::to_string(c.num_heads) +
        " is not a multiple of num_key_value_heads = " + std::to_string(c.num_kv_heads));
  }
  if (dtype_bits(dtype) % 8 != 0) {
    return invalid_argument("dtype " + std::string(dtype_name(dtype)) +
                            " packs several elements per byte; rows could not be split");
  }
  const int tp = layout.tp;
  if (tp < 1)
    return invalid_argument("tensor-parallel size must be >= 1, not " + std::to_string(tp));
  Mapping m;
  m.config = c;
  m.layout = layout;
  m.dtype = dtype;
  if (m.layout.padded_vocab_size == 0) m.layout.padded_vocab_size = c.vocab_size;
  const std::int64_t vp = m.layout.padded_vocab_size;
  if (vp < c.vocab_size) {
    return invalid_argument("padded vocab size " + std::to_string(vp) + " is below vocab_size " +
                            std::to_string(c.vocab_size));
  }
  // Megatron-core's attention divides both head counts by the TP size
  // (megatron/core/transformer/attention.py: divide(num_query_groups, world_size)).
  for (Status s : {divisible(c.num_heads, "num_attention_heads", tp),
                   divisible(c.num_kv_heads, "num_key_value_heads", tp),
                   divisible(c.intermediate_size, "intermediate_size", tp),
                   divisible(vp, "padded vocab size", tp)}) {
    if (!s.ok()) return s;
  }
  m.hf_tensors = model::hf_tensor_specs(c, dtype);

  const std::int64_t h = c.hidden_size, hd = c.head_dim, inter = c.intermediate_size;
  const std::int64_t q = c.num_heads * hd, kv = c.num_kv_heads * hd, qkv = q + 2 * kv;
  auto add = [&](std::string name, SplitKind split, std::vector<std::string> hf,
                 std::vector<std::int64_t> shape, std::int64_t layer) {
    std::vector<std::int64_t> shard = shape;
    if (split == SplitKind::kRow) {
      shard[1] /= tp;
    } else if (split != SplitKind::kReplicated) {
      shard[0] /= tp;
    }
    m.params.push_back(MegatronParam{std::move(name), split, std::move(hf), std::move(shape),
                                     std::move(shard), layer});
  };

  // GPTModel's state-dict order: embedding, decoder layers, final norm, output layer.
  add("embedding.word_embeddings.weight", SplitKind::kColumn, {"model.embed_tokens.weight"},
      {vp, h}, -1);
  const bool fused = layout.norms == NormLayout::kFused;
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = layer_prefix(i), hp = hf_prefix(i);
    if (!fused) {
      add(p + "input_layernorm.weight", SplitKind::kReplicated, {hp + "input_layernorm.weight"},
          {h}, i);
    }
    add(p + "self_attention.linear_proj.weight", SplitKind::kRow, {hp + "self_attn.o_proj.weight"},
        {h, q}, i);
    if (fused) {
      add(p + "self_attention.linear_qkv.layer_norm_weight", SplitKind::kReplicated,
          {hp + "input_layernorm.weight"}, {h}, i);
    }
    add(p + "self_attention.linear_qkv.weight", SplitKind::kQkv,
        {hp + "self_attn.q_proj.weight", hp + "self_attn.k_proj.weight",
         hp + "self_attn.v_proj.weight"},
        {qkv, h}, i);
    if (c.qkv_bias) {
      add(p + "self_attention.linear_qkv.bias", SplitKind::kQkv,
          {hp + "self_attn.q_proj.bias", hp + "self_attn.k_proj.bias",
           hp + "self_attn.v_proj.bias"},
          {qkv}, i);
    }
    if (c.qk_norm) {
      add(p + "self_attention.q_layernorm.weight", SplitKind::kReplicated,
          {hp + "self_attn.q_norm.weight"}, {hd}, i);
      add(p + "self_attention.k_layernorm.weight", SplitKind::kReplicated,
          {hp + "self_attn.k_norm.weight"}, {hd}, i);
    }
    if (!fused) {
      add(p + "pre_mlp_layernorm.weight", SplitKind::kReplicated,
          {hp + "post_attention_layernorm.weight"}, {h}, i);
    } else {
      add(p + "mlp.linear_fc1.layer_norm_weight", SplitKind::kReplicated,
          {hp + "post_attention_layernorm.weight"}, {h}, i);
    }
    add(p + "mlp.linear_fc1.weight", SplitKind::kGateUp,
        {hp + "mlp.gate_proj.weight", hp + "mlp.up_proj.weight"}, {2 * inter, h}, i);
    add(p + "mlp.linear_fc2.weight", SplitKind::kRow, {hp + "mlp.down_proj.weight"}, {h, inter}, i);
  }
  add("decoder.final_layernorm.weight", SplitKind::kReplicated, {"model.norm.weight"}, {h}, -1);
  // Tied: Megatron-core allocates no output_layer weight (it reuses the embedding).
  if (!c.tie_word_embeddings) {
    add("output_layer.weight", SplitKind::kColumn, {"lm_head.weight"}, {vp, h}, -1);
  }

  for (std::size_t i = 0; i < m.params.size(); ++i) m.param_index_.emplace(m.params[i].name, i);
  for (std::size_t i = 0; i < m.hf_tensors.size(); ++i)
    m.hf_index_.emplace(m.hf_tensors[i].name, i);
  return m;
}

}  // namespace ferry::convert

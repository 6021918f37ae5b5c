// config.json <-> ModelConfig, and the tensor list a config implies.
#include <nlohmann/json.hpp>
#include <string>

#include "ferry/model.h"
#include "model/family.h"

namespace ferry::model {

namespace {

using json = nlohmann::json;

Result<std::int64_t> positive_int(const json& doc, const char* key, std::string_view source) {
  if (!doc.contains(key)) return invalid_argument(std::string(source) + ": missing '" + key + "'");
  const json& v = doc[key];
  if (!v.is_number_integer() || v.get<std::int64_t>() <= 0) {
    return invalid_argument(std::string(source) + ": '" + key +
                            "' must be a positive integer, not " + v.dump());
  }
  return v.get<std::int64_t>();
}

}  // namespace

Result<ModelConfig> parse_hf_config(std::string_view json_text, std::string_view source) {
  json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return invalid_argument(std::string(source) + ": not a JSON object");
  }
  ModelConfig c;
  const std::string model_type = doc.value("model_type", "");
  if (model_type != "qwen2" && model_type != "qwen3" && model_type != "llama") {
    return invalid_argument(std::string(source) + ": model_type '" + model_type +
                            "' is not supported (expected qwen2, qwen3 or llama)");
  }
  c.family = model_type;
  c.architecture = architecture_for(model_type);
  if (doc.contains("architectures") && doc["architectures"].is_array() &&
      !doc["architectures"].empty() && doc["architectures"][0].is_string()) {
    c.architecture = doc["architectures"][0].get<std::string>();
  }
  struct Field {
    const char* key;
    std::int64_t* out;
  };
  for (const Field& f :
       {Field{"vocab_size", &c.vocab_size}, Field{"hidden_size", &c.hidden_size},
        Field{"num_hidden_layers", &c.num_layers}, Field{"num_attention_heads", &c.num_heads},
        Field{"intermediate_size", &c.intermediate_size}}) {
    auto v = positive_int(doc, f.key, source);
    if (!v.ok()) return v.status();
    *f.out = *v;
  }
  c.num_kv_heads = c.num_heads;
  if (doc.contains("num_key_value_heads") && !doc["num_key_value_heads"].is_null()) {
    auto v = positive_int(doc, "num_key_value_heads", source);
    if (!v.ok()) return v.status();
    c.num_kv_heads = *v;
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return invalid_argument(
        std::string(source) + ": num_attention_heads " + std::to_string(c.num_heads) +
        " is not a multiple of num_key_value_heads " + std::to_string(c.num_kv_heads));
  }
  c.head_dim = c.hidden_size / c.num_heads;
  if (doc.contains("head_dim") && !doc["head_dim"].is_null()) {
    auto v = positive_int(doc, "head_dim", source);
    if (!v.ok()) return v.status();
    c.head_dim = *v;
  }
  c.tie_word_embeddings = doc.value("tie_word_embeddings", false);
  c.qkv_bias = model_type == "qwen2" ? true : doc.value("attention_bias", false);
  c.qk_norm = model_type == "qwen3";
  c.rms_norm_eps = doc.value("rms_norm_eps", 1e-6);
  c.rope_theta = doc.value("rope_theta", 10000.0);
  c.max_position_embeddings = doc.value("max_position_embeddings", std::int64_t{32768});
  return c;
}

std::string hf_config_json(const ModelConfig& c, DType dtype) {
  nlohmann::ordered_json doc;
  doc["architectures"] = {c.architecture};
  doc["model_type"] = c.family;
  doc["vocab_size"] = c.vocab_size;
  doc["hidden_size"] = c.hidden_size;
  doc["intermediate_size"] = c.intermediate_size;
  doc["num_hidden_layers"] = c.num_layers;
  doc["num_attention_heads"] = c.num_heads;
  doc["num_key_value_heads"] = c.num_kv_heads;
  if (c.family == "qwen3" || c.head_dim != c.hidden_size / c.num_heads)
    doc["head_dim"] = c.head_dim;
  if (c.family == "llama") doc["attention_bias"] = c.qkv_bias;
  doc["hidden_act"] = "silu";
  doc["rms_norm_eps"] = c.rms_norm_eps;
  doc["rope_theta"] = c.rope_theta;
  doc["max_position_embeddings"] = c.max_position_embeddings;
  doc["tie_word_embeddings"] = c.tie_word_embeddings;
  std::string torch_dtype(dtype_torch_name(dtype));
  if (torch_dtype.starts_with("torch.")) torch_dtype.erase(0, 6);
  doc["torch_dtype"] = torch_dtype;
  doc["_generated_by"] = "ferry gen-model (synthetic weights)";
  return doc.dump(2) + "\n";
}

std::vector<TensorSpec> hf_tensor_specs(const ModelConfig& c, DType dtype) {
  std::vector<TensorSpec> out;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    out.push_back(TensorSpec{std::move(name), dtype, std::move(shape)});
  };
  const std::int64_t q = c.num_heads * c.head_dim;
  const std::int64_t kv = c.num_kv_heads * c.head_dim;
  add("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  // Per layer in PyTorch's state_dict order: attention, MLP, then the two norms.
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "self_attn.q_proj.weight", {q, c.hidden_size});
    if (c.qkv_bias) add(p + "self_attn.q_proj.bias", {q});
    add(p + "self_attn.k_proj.weight", {kv, c.hidden_size});
    if (c.qkv_bias) add(p + "self_attn.k_proj.bias", {kv});
    add(p + "self_attn.v_proj.weight", {kv, c.hidden_size});
    if (c.qkv_bias) add(p + "self_attn.v_proj.bias", {kv});
    add(p + "self_attn.o_proj.weight", {c.hidden_size, q});
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_dim});
      add(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    add(p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size});
    add(p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size});
    add(p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size});
    add(p + "input_layernorm.weight", {c.hidden_size});
    add(p + "post_attention_layernorm.weight", {c.hidden_size});
  }
  add("model.norm.weight", {c.hidden_size});
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, c.hidden_size});
  return out;
}

}  // namespace ferry::model

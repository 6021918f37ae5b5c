// Rank-local delivery for vLLM: the slice of each Hugging Face tensor that one tensor-parallel
// rank of a vLLM engine loads, as a TensorSlice a Receiver takes as a destination, so the rank
// copies only its slice out of the ring (and, on the device path, to its device).
//
//   auto slices = ferry::convert::vllm_tp_slices(config, manifest, /*tp_rank=*/1, /*tp_size=*/2);
//   for (const TensorSlice& s : *slices) receiver->set_destination(s, buffer_for(s.local));
//
// The rules are vLLM's for the Llama, Qwen2 and Qwen3 dense families
// (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py); docs/rank_local.md
// cites each.
#pragma once

#include <span>
#include <vector>

#include "ferry/export.h"
#include "ferry/model.h"
#include "ferry/status.h"
#include "ferry/tensor.h"

namespace ferry::convert {

// vLLM pads the vocabulary of VocabParallelEmbedding and ParallelLMHead to a multiple of this
// (DEFAULT_VOCAB_PADDING_SIZE) before splitting it across ranks.
inline constexpr std::int64_t kVllmVocabPadding = 64;

// For each tensor of `tensors` (Hugging Face names and whole shapes, as a trainer sends them),
// the slice rank `tp_rank` of `tp_size` holds:
//   q_proj (weight, bias)          dim 0, heads / tp_size heads per rank
//   k_proj, v_proj                 dim 0, kv_heads / tp_size heads per rank; when tp_size
//                                  exceeds kv_heads, one head per rank, head
//                                  tp_rank / (tp_size / kv_heads) (replicated)
//   gate_proj, up_proj             dim 0, intermediate / tp_size rows
//   o_proj, down_proj weights      dim 1 (their biases whole)
//   embed_tokens, lm_head          dim 0 of the vocabulary padded to kVllmVocabPadding; rows
//                                  past the vocabulary are padding no run covers
//   norms (input_layernorm, post_attention_layernorm, model.norm, q_norm, k_norm)  whole
// The local tensor keeps the Hugging Face name. Errors name the tensor: a name no rule covers,
// a shape the config does not give, a tp_size that does not divide the heads.
FERRY_EXPORT Result<std::vector<TensorSlice>> vllm_tp_slices(const model::ModelConfig& config,
                                                             std::span<const TensorSpec> tensors,
                                                             int tp_rank, int tp_size);

}  // namespace ferry::convert

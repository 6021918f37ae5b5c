"""A reference slicing written with torch from vLLM's rules (QKVParallelLinear,
MergedColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding / ParallelLMHead in
vllm/model_executor/layers/), independent of ferry's: the rank-local tests compare against it."""

from __future__ import annotations

import torch

PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE


def reference_slice(name: str, whole: torch.Tensor, cfg: dict, rank: int, tp: int):
    """What vLLM's weight loader keeps of `whole` on rank `rank` of `tp`."""
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    if "q_proj" in name:
        return whole.chunk(tp, dim=0)[rank]
    if "k_proj" in name or "v_proj" in name:
        if tp >= kv:  # one head per rank, each head on tp // kv ranks
            return whole.narrow(0, rank // (tp // kv) * d, d)
        return whole.chunk(tp, dim=0)[rank]
    if "gate_proj" in name or "up_proj" in name:
        return whole.chunk(tp, dim=0)[rank]
    if ("o_proj" in name or "down_proj" in name) and name.endswith("weight"):
        return whole.chunk(tp, dim=1)[rank]
    if "embed_tokens" in name or "lm_head" in name:
        vocab = whole.shape[0]
        per = -(-vocab // PADDING) * PADDING // tp
        local = torch.zeros((per,) + tuple(whole.shape[1:]), dtype=whole.dtype)
        rows = max(0, min(per, vocab - rank * per))
        local[:rows] = whole[rank * per: rank * per + rows]
        return local
    assert "norm" in name or name.endswith("bias"), name  # replicated
    return whole

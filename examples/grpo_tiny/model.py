"""The policy: a tiny transformers Qwen2 model (random weights, no hub), its sampler and the
log-probabilities GRPO trains on. Trainer and rollouts build it from the same config.json."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config


def qwen2_config(vocab: int, max_len: int, width: int, layers: int) -> Qwen2Config:
    """A Qwen2 architecture `layers` deep and `width` wide over the task's tokens."""
    return Qwen2Config(vocab_size=vocab, hidden_size=width, intermediate_size=4 * width,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=max_len, tie_word_embeddings=False,
                       architectures=["Qwen2ForCausalLM"])


def new_model(path: str) -> torch.nn.Module:
    """Random weights (from torch's current seed) for the config.json in `path`."""
    config = AutoConfig.from_pretrained(path, attn_implementation="eager")
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def completion_logprobs(model: torch.nn.Module, prompts: torch.Tensor,
                        completions: torch.Tensor) -> torch.Tensor:
    """[n, answer_len] log-probabilities of each completion token given what precedes it."""
    tokens = torch.cat([prompts, completions], dim=1)
    logits = model(input_ids=tokens[:, :-1]).logits[:, prompts.shape[1] - 1:]
    return torch.log_softmax(logits, dim=-1).gather(2, completions[..., None]).squeeze(2)


@torch.no_grad()
def sample(model: torch.nn.Module, prompts: torch.Tensor, length: int,
           generator: torch.Generator) -> torch.Tensor:
    """[n, length] completions sampled at temperature 1."""
    tokens = prompts
    for _ in range(length):
        probs = model(input_ids=tokens).logits[:, -1].softmax(dim=-1)
        tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return tokens[:, prompts.shape[1]:]

"""A small causal transformer (pre-norm GPT, learned positions) and its sampler."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    max_len: int
    width: int = 128
    layers: int = 2
    heads: int = 4


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.norm1 = nn.LayerNorm(config.width)
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(nn.Linear(config.width, 4 * config.width), nn.GELU(),
                                 nn.Linear(4 * config.width, config.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(n, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        attention = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(n, length, width))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.width)
        self.position = nn.Embedding(config.max_len, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """[n, length] tokens -> [n, length, vocab] logits of the next token."""
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def completion_logprobs(model: TinyGPT, prompts: torch.Tensor,
                        completions: torch.Tensor) -> torch.Tensor:
    """[n, answer_len] log-probabilities of each completion token given what precedes it."""
    tokens = torch.cat([prompts, completions], dim=1)
    logits = model(tokens[:, :-1])[:, prompts.shape[1] - 1:]
    return torch.log_softmax(logits, dim=-1).gather(2, completions[..., None]).squeeze(2)


@torch.no_grad()
def sample(model: TinyGPT, prompts: torch.Tensor, length: int,
           generator: torch.Generator) -> torch.Tensor:
    """[n, length] completions sampled at temperature 1."""
    tokens = prompts
    for _ in range(length):
        probs = model(tokens)[:, -1].softmax(dim=-1)
        tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return tokens[:, prompts.shape[1]:]


def weight_hash(model: nn.Module) -> str:
    """sha256 of every parameter's bytes, in name order: equal only for equal weights."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

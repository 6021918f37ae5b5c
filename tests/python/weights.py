"""Deterministic test weights: every dtype the tests cover, strided views, a tensor larger
than the bucket, tensors spanning buckets next to each other, many small ones."""

from __future__ import annotations

import torch

BUCKET_BYTES = 256 << 10


def make_weights(round_index: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 + round_index)
    base = torch.randn(256, 512, generator=g)
    weights = [
        ("embed.bf16", torch.randn(300, 200, generator=g).to(torch.bfloat16)),
        ("norm.fp16", torch.randn(1000, generator=g).to(torch.float16)),
        ("proj.fp32.transposed", base.t()),  # strided: copied once before sending
        ("proj.fp32.every_other", base[:, ::2]),
        ("big.int8", torch.randint(-128, 127, (700_000,), dtype=torch.int8, generator=g)),
        ("next.bf16", torch.randn(150_000, generator=g).to(torch.bfloat16)),  # spans too
        ("scalar.fp32", torch.tensor(float(round_index) + 0.5)),
        ("empty.fp16", torch.empty(0, 4, dtype=torch.float16)),
    ]
    for i in range(300):
        weights.append((f"small.{i}.fp32", torch.randn(1 + i % 13, generator=g)))
    weights.append(("tail.int8", torch.arange(33, dtype=torch.int8)))
    return weights


def specs_of(weights) -> list[tuple]:
    """(name, dtype, shape) of each tensor: a streamed round's manifest."""
    return [(name, t.dtype, tuple(t.shape)) for name, t in weights]


def from_one_buffer(weights):
    """Each tensor as a view of one buffer, refilled (and scribbled over) for the next, as
    verl's nixl engine with device=cpu yields them: right only if each is taken before the
    next is asked for."""
    buffer = torch.empty(4 << 20, dtype=torch.uint8)
    for name, tensor in weights:
        view = buffer[:tensor.numel() * tensor.element_size()].view(tensor.dtype)
        view = view.view(tensor.shape)
        view.copy_(tensor)
        yield name, view
        buffer.fill_(0xee)

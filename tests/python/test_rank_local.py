"""Rank-local delivery (ferry.vllm_tp_slices, Receiver.set_destination(..., slice=)): each
tensor-parallel rank of a rollout receives only its slice of every tensor, as vLLM's weight
loaders cut it. Checked byte for byte against a reference slicing written here with torch
from vLLM's rules (QKVParallelLinear, MergedColumnParallelLinear, RowParallelLinear,
VocabParallelEmbedding / ParallelLMHead in vllm/model_executor/layers/), on the full-depth
qwen2.5-0.5b (290 tensors) and on a tiny Qwen3 built by transformers from a config, whose
tp 4 exceeds its 2 key/value heads (vLLM replicates them)."""

from __future__ import annotations

import threading

import pytest
import torch

import ferry
from conftest import unique_address
from vllm_reference import reference_slice

TIMEOUT_S = 60
def _send(address: str, weights: list, ranks: int, errors: list, rounds: int = 1) -> None:
    try:
        with ferry.Sender(address, bucket_bytes=8 << 20, timeout=TIMEOUT_S) as sender:
            sender.accept(ranks)
            for _ in range(rounds):
                sender.send_round(weights)
    except ferry.FerryError as e:
        errors.append(e)


def _receive_as_ranks(config, weights: list, tp: int, senders: int = 1) -> list[tuple]:
    """Sends `weights` whole to `tp` receivers, each taking rank r's slices (from `senders`
    trainer ranks, each a part: split_into_parts, merged by a MultiReceiver); per rank its
    local tensors and RoundStats."""
    specs = [(n, ferry.ferry_dtype(t.dtype), tuple(t.shape)) for n, t in weights]
    addresses = [unique_address() for _ in range(senders)]
    parts = ferry.split_into_parts(specs, senders)
    errors: list = []
    threads = [threading.Thread(target=_send,
                                args=(a, [weights[i] for i in part], tp, errors))
               for a, part in zip(addresses, parts)]
    results = [None] * tp

    def rank(r: int) -> None:
        slices = ferry.vllm_tp_slices(config, specs, r, tp)
        local = ferry.local_tensors(slices)
        rx = (ferry.Receiver(addresses[0], r, timeout=TIMEOUT_S) if senders == 1
              else ferry.MultiReceiver(addresses, r, timeout=TIMEOUT_S))
        with rx:
            rx.set_destinations(local, slices=slices)
            results[r] = (local, rx.receive_round_into(), slices)

    threads += [threading.Thread(target=rank, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def _check(results, weights, cfg, tp):
    total = sum(t.numel() * t.element_size() for _, t in weights)
    for r, (local, stats, slices) in enumerate(results):
        for name, whole in weights:
            want = reference_slice(name, whole, cfg, r, tp)
            got = local[name]
            assert got.shape == want.shape, (name, r, got.shape, want.shape)
            assert torch.equal(got.view(torch.int16), want.contiguous().view(torch.int16)), (name, r)
        assert stats.bytes == total
        assert stats.delivered_bytes == sum(s.selected_bytes for s in slices)
    return [stats.delivered_bytes / total for _, stats, _ in results]


@pytest.mark.parametrize("senders", [1, 2])
def test_two_ranks_of_qwen2_5_0_5b_each_get_exactly_their_half(senders):
    specs = ferry.hf_tensor_specs("qwen2.5-0.5b", ferry.DType.BF16)
    assert len(specs) == 290
    g = torch.Generator().manual_seed(5)
    weights = [(n, torch.empty(s, dtype=torch.bfloat16).uniform_(-1, 1, generator=g))
               for n, _, s in specs]
    cfg = {"num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64}
    shares = _check(_receive_as_ranks("qwen2.5-0.5b", weights, 2, senders), weights, cfg, 2)
    # Each rank copies half of the model out of the ring, plus the replicated norms and
    # biases (and the k/v heads, split here since tp <= kv heads): within 0.1% of 1/2.
    for share in shares:
        assert abs(share - 0.5) < 0.001, shares


def test_tp4_over_two_kv_heads_replicates_them_as_vllm_does():
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(
        vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    weights = [(n, t.detach().contiguous()) for n, t in model.state_dict().items()]
    cfg = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    shares = _check(_receive_as_ranks(config, weights, 4), weights, cfg, 4)
    assert all(s < 0.5 for s in shares), shares  # each rank copies ~1/4 plus what it shares


def test_mistakes_are_named():
    specs = ferry.hf_tensor_specs("qwen2.5-0.5b", ferry.DType.BF16)
    with pytest.raises(ferry.InvalidArgumentError, match="does not divide the model's 14"):
        ferry.vllm_tp_slices("qwen2.5-0.5b", specs, 0, 4)
    with pytest.raises(ferry.InvalidArgumentError, match="no vLLM tensor-parallel rule"):
        ferry.vllm_tp_slices("qwen2.5-0.5b", [("model.visual.patch", ferry.DType.BF16, (4,))], 0, 2)
    slices = ferry.vllm_tp_slices("qwen2.5-0.5b", specs, 0, 2)
    with ferry.Sender(unique_address(), timeout=5) as sender:
        accepting = threading.Thread(target=sender.accept, args=(1,))
        accepting.start()
        with ferry.Receiver(sender.address, 0, timeout=5) as rx:
            accepting.join()
            whole = torch.zeros(151936, 896, dtype=torch.bfloat16)
            with pytest.raises(ferry.InvalidArgumentError,
                               match=r"the tensor is \[151936, 896\] BF16, the slice \[75968, 896\]"):
                rx.set_destination("model.embed_tokens.weight", whole, slice=slices[0])
            with pytest.raises(ferry.InvalidArgumentError, match="the slice given is of"):
                rx.set_destination("lm_head.weight", whole, slice=slices[0])

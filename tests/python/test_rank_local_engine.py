"""The verl backend's rank-local setting (engine_kwargs.ferry.tp_size, hf_config): the engine
declares verl's `rank_local_named_tensors`, each rollout rank cuts vLLM's slice of every tensor
it receives (byte for byte as the reference slicing in vllm_reference.py), as a view of the
received tensor where the slice is one block of it, and bad settings are named. The whole
path under verl's real manager is tests/verl_stack/test_60_rank_local.py."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import fake_device
import ferry
from ferry.verl._rank_local import LocalSlicer
from ferry.verl._sessions import plan_topology
from ferry.verl.checkpoint_engine import FerryCheckpointEngine
from vllm_reference import reference_slice

# A Qwen2 whose vocabulary (1000) vLLM pads to 1024: rank 1 of 2 holds 24 padding rows.
CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 128,
          "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 1000, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16"}
SHAPES = {"model.embed_tokens.weight": (1000, 128),
          "model.layers.0.self_attn.q_proj.weight": (128, 128),
          "model.layers.0.self_attn.q_proj.bias": (128,),
          "model.layers.0.self_attn.k_proj.weight": (64, 128),
          "model.layers.0.self_attn.v_proj.bias": (64,),
          "model.layers.0.self_attn.o_proj.weight": (128, 128),
          "model.layers.0.mlp.gate_proj.weight": (256, 128),
          "model.layers.0.mlp.down_proj.weight": (128, 256),
          "model.layers.0.input_layernorm.weight": (128,),
          "model.norm.weight": (128,),
          "lm_head.weight": (1000, 128)}


def _weights(seed: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in SHAPES.items()}


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_each_rank_cuts_vllms_slice(tp):
    weights = _weights()
    cfg = {**CONFIG, "head_dim": 32}
    for rank in range(tp):
        slicer = LocalSlicer(CONFIG, rank, tp)
        for name, whole in weights.items():
            got_name, local, spec = slicer.cut(name, whole)
            want = reference_slice(name, whole, cfg, rank, tp)
            assert got_name == name and local.dtype == whole.dtype
            assert local.shape == want.shape and torch.equal(local, want), (name, rank, tp)
            assert tuple(spec.full_shape) == tuple(whole.shape)
            assert tuple(spec.place.local_shape) == tuple(want.shape)
            padded = "embed" in name or "lm_head" in name
            if not (padded and rank == tp - 1):  # a view: nothing copied (1000 rows pad to 1024)
                start, end = whole.data_ptr(), whole.data_ptr() + whole.nbytes
                assert start <= local.data_ptr() < end, (name, rank, tp)


def test_padding_rows_are_zero_and_outside_the_tensor():
    whole = _weights()["lm_head.weight"]
    _, local, spec = LocalSlicer(CONFIG, 1, 2).cut("lm_head.weight", whole)
    assert local.shape == (512, 128) and spec.place.global_offset == (512, 0)
    assert torch.equal(local[:488], whole[512:]) and not local[488:].any()


def test_settings_are_checked():
    engine = FerryCheckpointEngine(1 << 20)
    try:
        assert engine.wire_format == "named_tensors"
    finally:
        engine.close()
    engine = FerryCheckpointEngine(1 << 20, tp_size=2, hf_config=CONFIG)
    try:
        assert engine.wire_format == "rank_local_named_tensors"
    finally:
        engine.close()
    with pytest.raises(ferry.InvalidArgumentError, match="hf_config"):
        FerryCheckpointEngine(1 << 20, tp_size=2)
    with pytest.raises(ferry.InvalidArgumentError, match="tp_size='two'"):
        FerryCheckpointEngine(1 << 20, tp_size="two", hf_config=CONFIG)


def test_a_rollout_that_is_not_whole_tp_groups_is_refused():
    trainer = [{"is_master": True, "node": "a", "pid": 1, "shm": "@s", "net": None,
                "host": "h", "senders": 1}]
    rollout = [{"node": "a", "pid": 10 + i, "relay": f"@r{i}", "tp_size": 2} for i in range(3)]
    with pytest.raises(ferry.InvalidArgumentError, match="tp_size=2, but there are 3 rollout"):
        plan_topology(1, 3, trainer + rollout)


def test_a_config_folder_that_is_not_there_fails_when_the_slicer_is_made(tmp_path):
    with pytest.raises(ferry.NotFoundError, match="no-such-model"):
        LocalSlicer(str(tmp_path / "no-such-model"), 0, 2)


def test_a_config_folder_is_read_once(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    slicer = LocalSlicer(str(tmp_path), 1, 2)
    (tmp_path / "config.json").unlink()  # later cuts need the file no more
    whole = _weights()["model.layers.0.mlp.down_proj.weight"]
    _, local, _ = slicer.cut("model.layers.0.mlp.down_proj.weight", whole)
    assert torch.equal(local, whole.chunk(2, dim=1)[1])


def test_a_tensor_no_rule_covers_is_named():
    slicer = LocalSlicer(CONFIG, 0, 2)
    with pytest.raises(ferry.InvalidArgumentError, match="model.layers.0.mystery"):
        slicer.cut("model.layers.0.mystery.weight", torch.zeros(4, 4))


async def _shards(received) -> dict[str, tuple]:
    return {name: (shard.to("cpu").clone(), spec) async for name, shard, spec in received}


def _update(engines: list, weights: list, step: int) -> list[dict]:
    """One update from engines[0] (master) to the others (rollout ranks), verl's sequence,
    threads for Ray's workers; each rollout rank's shards."""
    master, rollouts = engines[0], engines[1:]
    trainer_kw, rollout_kw = FerryCheckpointEngine.build_topology(
        1, len(rollouts), [e.prepare() for e in engines])
    with ThreadPoolExecutor(len(engines)) as pool:
        inits = [pool.submit(master.init_process_group, **{k: v[0] for k, v in trainer_kw.items()})]
        inits += [pool.submit(r.init_process_group, **{k: v[i] for k, v in rollout_kw.items()})
                  for i, r in enumerate(rollouts)]
        for f in inits:
            f.result(timeout=60)
        sent = pool.submit(asyncio.run, master.send_weights(weights, global_steps=step))
        got = [pool.submit(asyncio.run, _shards(r.receive_weights(global_steps=step)))
               for r in rollouts]
        sent.result(timeout=60)
        return [f.result(timeout=60) for f in got]


@pytest.mark.parametrize("device", ["cpu", "fake:0"])
def test_two_rollout_ranks_get_their_slices_and_only_those_cross_to_the_device(device):
    """A master and two rollout ranks of one TP group (threads, shm), 1 MiB buckets so the
    256 KiB embedding crosses none but the bucketed path is taken (fake device: each bucket is
    copied to the device). Two updates: staged, then streamed."""
    fake = fake_device.use() if device != "cpu" else None
    kwargs = {"tp_size": 2, "hf_config": CONFIG, "timeout_s": 20.0, "device": device}
    engines = [FerryCheckpointEngine(1 << 20, is_master=True, **kwargs)]
    engines += [FerryCheckpointEngine(1 << 20, **kwargs) for _ in range(2)]
    cfg = {**CONFIG, "head_dim": 32}
    try:
        for step in (1, 2):
            weights = _weights(seed=step)
            if fake is not None:
                fake.log.clear()
            shards = _update(engines, list(weights.items()), step)
            for rank, got in enumerate(shards):
                assert sorted(got) == sorted(weights), rank
                for name, whole in weights.items():
                    shard, spec = got[name]
                    want = reference_slice(name, whole, cfg, rank, 2)
                    assert torch.equal(shard, want), (name, rank, step)
                    assert tuple(spec.full_shape) == tuple(whole.shape)
            if fake is not None:  # what the rollout ranks copied to the device: their slices
                crossed = sum(e[1] for e in fake.log if e[0] == "issue" and e[2] == "receive")
                local = sum(s.nbytes for got in shards for s, _ in got.values())
                assert crossed == local < sum(w.nbytes for w in weights.values()) * 2 * 0.6
    finally:
        for e in engines:
            e.close()

"""Rank-local delivery (engine_kwargs.ferry.tp_size, hf_config) under verl's real manager: one
rollout replica of tensor-parallel size 2, whose two ranks each get only vLLM's slice of every
tensor, in verl's `rank_local_named_tensors` form (name, shard, ShardSpec), byte for byte as
the reference slicing (tests/python/vllm_reference.py) cuts the trainer's weights; from one
trainer rank and from two that both send. Stand-in: the rollout is ferry.verl.cpu_rollout's
CPU adapter taking that form (verl 0.9.1's vLLM adapter asserts named_tensors), which keeps
the shards it was given for the check instead of loading them."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest
import ray
import torch

from ferry.verl.cpu_rollout import cpu_rollout_replicas
from verl.checkpoint_engine.base import CheckpointEngineManager
from verl_stack_checks import trainer_state, workers_of

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from vllm_reference import reference_slice  # noqa: E402

TP = 2


@pytest.mark.parametrize("senders", [1, 2])
def test_each_rank_of_a_tp_group_gets_only_its_slice(stack, model_path, senders):
    kwargs = {"tp_size": TP, "hf_config": model_path}
    ce = dataclasses.replace(
        stack.ce_config, engine_kwargs={"ferry": {**stack.ce_config.engine_kwargs["ferry"],
                                                  **kwargs}})
    rollout_config = dataclasses.replace(stack.rollout_config, tensor_model_parallel_size=TP,
                                         checkpoint_engine=ce)
    wg, replicas = cpu_rollout_replicas(rollout_config, stack.model_config, 1,
                                        first_replica_rank=stack.next_replica_rank,
                                        adapter_hooks={"accept_rank_local": True})
    stack.next_replica_rank += 1
    trainer = stack.new_trainer(senders, senders=senders, **kwargs)
    try:
        _updates(stack, CheckpointEngineManager(ce, trainer, replicas), trainer, replicas,
                 model_path)
    finally:  # this test's actors only: the session keeps the others
        for worker in wg.workers + trainer.workers:
            ray.kill(worker)


def _updates(stack, manager, trainer, replicas, model_path: str) -> None:
    """Two updates, each checked on every rank of the TP group against the reference."""
    with open(os.path.join(model_path, "config.json")) as f:
        cfg = json.load(f)
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    for i in range(2):  # staged, then streamed against the manifest of the first
        if i:
            trainer.optimizer_step(seed=700 + i)
        step = stack.next_step()
        manager.update_weights(global_steps=step)
        expected = trainer_state(trainer)
        model_bytes = sum(t.nbytes for t in expected.values())
        for worker in workers_of(replicas):
            state = ray.get(worker.adapter_state.remote())
            rank = state["rollout_rank"]
            where = f"tp rank {rank} (pid {state['pid']}), update {i + 1}"
            assert state["error"] is None and state["global_steps"] == step, (where, state)
            shards = ray.get(worker.adapter_local.remote())
            assert sorted(shards) == sorted(expected), f"{where}: names differ"
            want_bytes = 0
            for name, whole in expected.items():
                shard, spec = shards[name]
                want = reference_slice(name, whole, cfg, rank, TP)
                want_bytes += want.nbytes
                assert tuple(spec.full_shape) == tuple(whole.shape), (where, name)
                assert shard.dtype == want.dtype and shard.shape == want.shape, (where, name)
                assert torch.equal(shard, want), f"{where}: '{name}' differs from its slice"
            assert state["local_bytes"] == want_bytes, where
            print(f"{where}: {want_bytes} of {model_bytes} bytes "
                  f"({want_bytes / model_bytes:.3f} of the model)")
            assert want_bytes < 0.6 * model_bytes, where

"""The rollout side: verl's CheckpointEngineWorker (through ferry's CPU stand-in for vLLM's
server adapter, ferry.verl.cpu_rollout), plus what a rollout server would do here: sample.

verl's CheckpointEngineManager drives the weight update (receive_weights -> the adapter's
update_weights, which copies each tensor into its transformers model by name); `generate`
samples with that same model, so every rollout answers with the weights it received."""

from __future__ import annotations

import torch
from ferry.verl.cpu_rollout import (CpuCheckpointEngineWorker, CpuRolloutReplica,
                                    cpu_rollout_replicas)
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayWorkerGroup

from model import sample
from task import AdditionTask


class RolloutWorker(CpuCheckpointEngineWorker):
    """One rollout rank. Its adapter's model starts with its own random weights (seeded by
    its replica rank, unlike the trainer's): only the weight updates make them equal."""

    def __init__(self, rollout_config, model_config, max_operand: int, seed: int,
                 **kwargs) -> None:
        torch.set_num_threads(1)
        super().__init__(rollout_config, model_config, **kwargs)
        self.task = AdditionTask(max_operand)
        self.seed = seed

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def generate(self, operands: torch.Tensor, group: int, step: int) -> torch.Tensor:
        """`group` answers (temperature 1) to each "a+b=" of `operands`: [n * group, digits]."""
        adapter = self.server_adapter
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 2 +
                                                  adapter.replica_rank)
        prompts = self.task.prompts(operands).repeat_interleave(group, dim=0)
        return sample(adapter.model, prompts, self.task.answer_digits, generator)


def start_rollouts(count: int, rollout_config, model_config, max_operand: int, seed: int
                   ) -> tuple[RayWorkerGroup, list[CpuRolloutReplica]]:
    """`count` one-rank replicas as one verl worker group (CPU only, as verl builds a
    replica's workers), and the replicas CheckpointEngineManager takes."""
    return cpu_rollout_replicas(rollout_config, model_config, num_replicas=count,
                                name_prefix="rollout", worker_cls=RolloutWorker,
                                max_operand=max_operand, seed=seed)

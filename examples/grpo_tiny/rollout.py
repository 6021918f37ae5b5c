"""The rollout side: verl's CheckpointEngineWorker (through ferry's CPU stand-in for vLLM's
server adapter, ferry.verl.cpu_rollout), plus what a rollout server would do here: sample.

verl's CheckpointEngineManager drives the weight update (receive_weights -> the adapter's
update_weights, which copies each tensor into its transformers model by name); `generate`
samples with that same model, so every rollout answers with the weights it received."""

from __future__ import annotations

import ray
import torch
from ferry.verl.cpu_rollout import CpuCheckpointEngineWorker, CpuRolloutReplica
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

from model import sample
from task import AdditionTask


class RolloutWorker(CpuCheckpointEngineWorker):
    """One rollout rank. Its adapter's model starts with its own random weights (seeded by
    its replica rank, unlike the trainer's): only the weight updates make them equal."""

    def __init__(self, rollout_config, model_config, max_operand: int, seed: int) -> None:
        torch.set_num_threads(1)
        super().__init__(rollout_config, model_config)
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
    pool = RayResourcePool(process_on_nodes=[count], use_gpu=False, max_colocate_count=1)
    worker = RayClassWithInitArgs(cls=ray.remote(RolloutWorker),
                                  rollout_config=rollout_config, model_config=model_config,
                                  max_operand=max_operand, seed=seed)
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, use_gpu=False,
                           device_name="cpu", name_prefix="rollout")
    replicas = [CpuRolloutReplica(rank, rollout_config, model_config, workers=[handle])
                for rank, handle in enumerate(group.workers)]
    return group, replicas

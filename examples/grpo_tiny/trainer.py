"""The trainer: a verl single-controller Worker (a Ray actor in a RayWorkerGroup) holding the
policy, its optimizer and, as verl's actor workers do, a checkpoint engine built from verl's
CheckpointEngineConfig through verl's registry (here ferry's, registered as "ferry").

verl's CheckpointEngineManager calls `execute_checkpoint_engine` (prepare, init_process_group,
finalize) and `update_weights`, which sends the model's state_dict through the engine."""

from __future__ import annotations

import torch
from ferry.verl.cpu_rollout import weight_hash
from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.import_utils import import_external_libs

import grpo
from model import new_model
from task import AdditionTask


class TrainerWorker(Worker):
    def __init__(self, model_path: str, engine_config, max_operand: int, lr: float,
                 seed: int) -> None:
        super().__init__()
        torch.set_num_threads(1)  # deterministic, and kind to a shared machine
        torch.manual_seed(seed)
        self.model = new_model(model_path)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.task = AdditionTask(max_operand)
        self.generator = torch.Generator().manual_seed(seed)
        # As verl's engine workers build theirs (verl/workers/engine_workers.py).
        import_external_libs(engine_config.custom_backend_module or None)
        self.checkpoint_engine = CheckpointEngineRegistry.new(
            engine_config.backend, is_master=self.rank == 0,
            bucket_size=engine_config.update_weights_bucket_megabytes << 20,
            **engine_config.engine_kwargs.get(engine_config.backend, {}))

    # -- what verl's CheckpointEngineManager calls ----------------------------------------
    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args, **kwargs):
        return getattr(self.checkpoint_engine, method)(*args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> dict:
        weights = ((name, tensor.detach()) for name, tensor in self.model.state_dict().items())
        return await self.checkpoint_engine.send_weights(weights, global_steps=global_steps) or {}

    # -- the example's own calls ----------------------------------------------------------
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state(self) -> dict:
        return {"hash": weight_hash(self.model.state_dict()),
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "sessions_built": self.checkpoint_engine.sessions_built}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def warm_up(self, steps: int, batch: int = 128) -> None:
        """Supervised steps on right answers, so that RL starts from a model that reads its
        input (docs/quickstart.md)."""
        for _ in range(steps):
            operands = self.task.sample_operands(batch, self.generator)
            loss = grpo.supervised_loss(self.model, self.task.prompts(operands),
                                        self.task.answers(operands))
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def learn(self, operands: torch.Tensor, completions: torch.Tensor, group: int) -> float:
        """Scores the rollouts' `group` completions per prompt and takes one GRPO step;
        returns the mean reward."""
        repeated = operands.repeat_interleave(group, dim=0)
        correct = self.task.correct_digits(repeated, completions)
        loss = grpo.policy_loss(self.model, self.task.prompts(repeated), completions,
                                grpo.group_advantages(correct, group))
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return correct.mean().item()

"""Ray-side classes of tests/netns/verl_stack_netns.py, importable by every Ray node's workers
(verl_stack_netns.sh puts this folder on the PYTHONPATH each `ray start` passes on).

TrainerWorker: the trainer, a verl single-controller Worker holding a transformers Qwen2
model and, as verl's actor workers do, a checkpoint engine built from verl's
CheckpointEngineConfig through verl's registry (ferry's, registered as "ferry"). verl's
CheckpointEngineManager calls its execute_checkpoint_engine (prepare, init_process_group,
finalize) and update_weights, which sends the model's state_dict through the engine. A
stand-in for verl's FSDP ActorRolloutRefWorker (tests/verl_stack/ runs that one on one node):
between updates its weights change by a seeded perturbation instead of an optimizer step.

NodePool: verl's RayResourcePool whose placement group is pinned to one Ray node by a custom
resource that only that node has (the test's "nodes" are network namespaces of one machine,
so Ray's own spreading cannot tell them apart).
"""

from __future__ import annotations

import os
import time
from typing import Any

import ray
import torch
from ray.util.placement_group import placement_group
from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayResourcePool
from verl.utils.import_utils import import_external_libs

from ferry.verl.cpu_rollout import weight_hash


class NodePool(RayResourcePool):
    """`count` processes (one logical CPU each), all on the Ray node holding `resource`."""

    def __init__(self, count: int, resource: str) -> None:
        super().__init__(process_on_nodes=[count], use_gpu=False, max_colocate_count=1)
        self.resource = resource

    def get_placement_groups(self, strategy: str = "STRICT_PACK", name: str | None = None,
                             device_name: str = "cuda") -> list:
        if self.pgs is None:
            bundles = [{"CPU": 1, self.resource: 1} for _ in range(self.world_size)]
            pg = placement_group(bundles, strategy="STRICT_PACK")
            ray.get(pg.ready(), timeout=120)
            self.pgs = [pg]
        return self.pgs


class TrainerWorker(Worker):
    """The trainer (module docstring). update_weights records its outcome for record()."""

    def __init__(self, model_path: str, engine_config: Any) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(model_path,
                                                          attn_implementation="eager").eval()
        # As verl's engine workers build theirs (verl/workers/engine_workers.py).
        import_external_libs(engine_config.custom_backend_module or None)
        self.checkpoint_engine = CheckpointEngineRegistry.new(
            engine_config.backend, is_master=self.rank == 0,
            bucket_size=engine_config.update_weights_bucket_megabytes << 20,
            **engine_config.engine_kwargs.get(engine_config.backend, {}))
        self.error: str | None = None
        self.failed_at: float | None = None  # time.monotonic(): one clock for the machine

    # -- what verl's CheckpointEngineManager calls ----------------------------------------

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args, **kwargs):
        return getattr(self.checkpoint_engine, method)(*args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> dict:
        self.error = self.failed_at = None
        weights = ((name, tensor.detach()) for name, tensor in self.model.state_dict().items())
        try:
            return await self.checkpoint_engine.send_weights(weights,
                                                             global_steps=global_steps) or {}
        except BaseException as e:
            self.error, self.failed_at = f"{type(e).__name__}: {e}", time.monotonic()
            raise

    # -- the test's own calls -------------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def perturb(self, seed: int) -> None:
        """New weights: every parameter moved by seeded noise."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 1e-2)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the model's state dict."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state(self) -> dict:
        """pid, network namespace, the weights' hash (as the rollout's adapter computes it),
        bytes of the model, its names in the order sent, the last update's error and when it
        was raised."""
        state = self.model.state_dict()
        return {"pid": os.getpid(), "netns": os.readlink("/proc/self/ns/net"),
                "hash": weight_hash(state),
                "bytes": sum(t.numel() * t.element_size() for t in state.values()),
                "names": list(state), "error": self.error, "failed_at": self.failed_at}

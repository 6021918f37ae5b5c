"""A CPU rollout for verl's checkpoint-engine path: stands in for vLLM where there is no GPU.

vLLM (and SGLang, TensorRT-LLM) cannot run on a CPU-only machine, so verl's own server
adapters cannot be built there. This module gives verl's real classes a rollout that can:

- ``CpuServerAdapter``: a verl ``BaseRollout`` holding a transformers model on the CPU.
  ``update_weights`` checks ``wire_format`` as verl's vLLM adapter does (only
  ``"named_tensors"``; anything else raises ``AssertionError`` naming it), copies each
  ``(name, tensor)`` of the (sync or async) generator into the model by name (an unknown name,
  shape or dtype raises, naming it) and keeps ``weight_hash`` of the result. Test hooks
  (``configure``): raise on update N, pause on update N (so a test can kill the process at a
  known point), write into every tensor it was given after copying it.
- ``CpuCheckpointEngineWorker``: verl's ``CheckpointEngineWorker`` with a ``CpuServerAdapter``
  built in the actor (verl's worker builds its adapter through ``get_rollout_class``, which
  knows only vllm / sglang / trtllm, unless ``server_adapter=`` is passed: this passes it).
  Everything verl calls (``update_weights``, ``execute_checkpoint_engine``, ...) is verl's;
  it adds ``adapter_state`` / ``adapter_weights`` / ``configure_adapter`` for inspection.
- ``CpuRolloutReplica``: a verl ``RolloutReplica`` for ``CheckpointEngineManager(config,
  actor_wg, replicas)``: ``.workers`` holds the Ray handles of its ``CpuCheckpointEngineWorker``
  actors; the server-side calls the manager makes around an update (abort_all_requests,
  release_kv_cache, resume_kv_cache, resume_generation, sleep, wake_up) are no-ops, as there is
  no server and no KV cache on the CPU.
- ``cpu_rollout_replicas(...)``: starts ``num_replicas x world_size`` workers in one Ray
  worker group (CPU only) and returns ``(worker_group, replicas)``.

Usage (a Ray session running; ``rollout_config.tensor_model_parallel_size`` ranks a replica)::

    wg, replicas = cpu_rollout_replicas(rollout_config, model_config, num_replicas=2)
    manager = CheckpointEngineManager(rollout_config.checkpoint_engine, actor_wg, replicas)
    manager.update_weights(global_steps=1)
    wg.adapter_state()  # one dict per rank: {"hash": ..., "completed": 1, "pid": ...}
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import Any, Iterable, Mapping

import torch

try:
    import ray
    from verl.checkpoint_engine.base import CheckpointEngineWorker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.workers.rollout.base import BaseRollout
    from verl.workers.rollout.replica import RolloutReplica
    from verl.workers.rollout.utils import ensure_async_iterator
except ImportError as e:  # pragma: no cover - this module is verl's, by definition
    raise ImportError(f"ferry.verl.cpu_rollout needs verl and ray: {e}") from e

WIRE_FORMAT = "named_tensors"  # what verl's vLLM adapter accepts besides "delta_flush"
# (name, local shard, ShardSpec): taken only with configure(accept_rank_local=True), as a
# rollout whose ranks load tensor-parallel shards would (verl 0.9.1's adapters refuse it).
RANK_LOCAL_WIRE_FORMAT = "rank_local_named_tensors"


def weight_hash(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name and bytes, in name order: equal only for equal
    weights (the quick start's examples/grpo_tiny/model.py hashes the same way)."""
    h = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _replica_world_size(rollout_config: Any) -> int:
    return (rollout_config.tensor_model_parallel_size * rollout_config.data_parallel_size
            * rollout_config.pipeline_model_parallel_size)


def _cpu_model(model_config: Any, load_format: str, seed: int) -> torch.nn.Module:
    """The rollout's model: the checkpoint at model_config.local_path, or with load_format
    "dummy" (verl's default) its architecture with random weights, as vLLM's dummy load."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = model_config.local_path
    # verl's HFModelConfig asks for flash_attention_2, which needs CUDA: eager on the CPU.
    config = AutoConfig.from_pretrained(path, attn_implementation="eager")
    if load_format == "dummy":
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    else:
        model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype="auto")
    return model.eval()


class CpuServerAdapter(BaseRollout):
    """verl's BaseRollout on the CPU (module docstring). One update_weights at a time.

    config, model_config: verl's RolloutConfig and HFModelConfig (or their OmegaConf form).
    model: a torch module to load into; default, one built from model_config (above).
    replica_rank, rollout_rank: this rank's place, for is_leader_rank and messages.
    hooks: see configure().
    """

    def __init__(self, config: Any, model_config: Any, device_mesh: Any = None, *,
                 model: torch.nn.Module | None = None, replica_rank: int = 0,
                 rollout_rank: int = 0, **hooks: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        self.replica_rank = int(replica_rank)
        self.rollout_rank = int(rollout_rank)
        seed = 1000 + 97 * self.replica_rank + self.rollout_rank  # dummy weights differ per rank
        self.model = model if model is not None else _cpu_model(
            self.model_config, self.config.load_format, seed)
        # Detached tensors sharing the model's storage: copies into them need no no_grad().
        self._targets = self.model.state_dict()
        self.updates = 0             # update_weights calls so far, failed ones included
        self.completed = 0           # update_weights calls that loaded every tensor given
        self.global_steps: int | None = None
        self.hash = weight_hash(self._targets)
        self.received: list[str] = []  # names of the last update, in order
        self.paused = False
        self.written = 0  # tensors overwritten by write_into_received, over all updates
        self.error: str | None = None        # the last update's exception, if it raised
        self.failed_at: float | None = None  # its time.monotonic() (system-wide on Linux)
        self.fail_on_update: int | None = None
        self.fail_after_tensors = 1
        self.fail_message = "injected consumer failure"
        self.pause_on_update: int | None = None
        self.pause_after_tensors = 1
        self.write_into_received = False
        self.accept_rank_local = False
        self.local: dict[str, tuple] = {}  # rank-local: name -> (its shard, ShardSpec)
        self.local_bytes = 0               # rank-local: bytes of the last update's shards
        self.configure(**hooks)

    def configure(self, fail_on_update: int | None = None, fail_after_tensors: int = 1,
                  fail_message: str = "injected consumer failure",
                  pause_on_update: int | None = None, pause_after_tensors: int = 1,
                  write_into_received: bool = False, accept_rank_local: bool = False) -> None:
        """Test hooks, counted in update_weights calls of this adapter (1 is the first):
        fail_on_update: raise RuntimeError(fail_message) after fail_after_tensors tensors of
        that update; pause_on_update: after pause_after_tensors tensors of that update, wait
        (the event loop stays free) until the process is killed, with `paused` set;
        write_into_received: after copying each tensor, overwrite the tensor it was given
        (fills it with 0x5A bytes), as a consumer that uses its input as scratch space;
        accept_rank_local: take RANK_LOCAL_WIRE_FORMAT, keeping a copy of each shard (`local`)
        instead of loading it (the model here is whole)."""
        self.fail_on_update = fail_on_update
        self.fail_after_tensors = int(fail_after_tensors)
        self.fail_message = str(fail_message)
        self.pause_on_update = pause_on_update
        self.pause_after_tensors = int(pause_after_tensors)
        self.write_into_received = bool(write_into_received)
        self.accept_rank_local = bool(accept_rank_local)

    @property
    def is_leader_rank(self) -> bool:
        return self.rollout_rank == 0

    async def resume(self, tags: list[str]) -> None:
        """Nothing to resume: the weights stay in host memory, there is no KV cache."""

    async def release(self) -> None:
        """Nothing to release (see resume)."""

    async def update_weights(self, weights: Iterable | Any, global_steps: int | None = None,
                             wire_format: str = WIRE_FORMAT, **kwargs: Any) -> None:
        """Copies every (name, tensor) of `weights` into the model by name, as verl's vLLM
        adapter hands them to vLLM's load_weights; then updates `hash`."""
        rank_local = wire_format == RANK_LOCAL_WIRE_FORMAT and self.accept_rank_local
        assert wire_format == WIRE_FORMAT or rank_local, (
            f"CPU rollout (as verl's vLLM rollout) supports wire_format={WIRE_FORMAT!r}; "
            f"got {wire_format!r}")
        self.updates += 1
        self.received, self.error, self.failed_at = [], None, None
        try:
            if rank_local:
                await self._keep_local(weights)
            else:
                await self._load(weights, self.updates)
        except BaseException as e:
            self.error, self.failed_at = f"{type(e).__name__}: {e}", time.monotonic()
            raise
        self.completed += 1
        self.global_steps = global_steps
        self.hash = weight_hash(self._targets)

    async def _load(self, weights: Iterable | Any, update: int) -> None:
        count = 0
        async for name, tensor in ensure_async_iterator(weights):
            target = self._targets.get(name)
            if target is None:
                raise KeyError(f"CpuServerAdapter: '{name}' is not a weight of the rollout "
                               f"model {type(self.model).__name__} ({len(self._targets)} weights)")
            if target.shape != tensor.shape or target.dtype != tensor.dtype:
                raise ValueError(f"CpuServerAdapter: '{name}' is {tensor.dtype}"
                                 f"{list(tensor.shape)}, the rollout model has {target.dtype}"
                                 f"{list(target.shape)}")
            target.copy_(tensor)
            if self.write_into_received:
                tensor.view(-1).view(torch.uint8).fill_(0x5A)
                self.written += 1
            self.received.append(name)
            count += 1
            if update == self.fail_on_update and count == self.fail_after_tensors:
                raise RuntimeError(self.fail_message)
            if update == self.pause_on_update and count == self.pause_after_tensors:
                self.paused = True
                while True:  # until killed
                    await asyncio.sleep(0.05)

    async def _keep_local(self, weights: Iterable | Any) -> None:
        """Rank-local: checks each (name, shard, spec) against the model's whole tensor and
        keeps a copy of the shard."""
        self.local, self.local_bytes = {}, 0
        async for name, shard, spec in ensure_async_iterator(weights):
            target = self._targets.get(name)
            if target is None:
                raise KeyError(f"CpuServerAdapter: '{name}' is not a weight of the rollout model")
            if tuple(spec.full_shape) != tuple(target.shape) or shard.dtype != target.dtype:
                raise ValueError(f"CpuServerAdapter: shard of '{name}' is of {shard.dtype}"
                                 f"{list(spec.full_shape)}, the rollout model has "
                                 f"{target.dtype}{list(target.shape)}")
            self.local[name] = (shard.clone(), spec)
            self.local_bytes += shard.numel() * shard.element_size()
            self.received.append(name)

    def state(self) -> dict[str, Any]:
        """What a test or a trainer checks: pid, ranks, counts (updates begun, completed), the
        last completed update's global_steps and hash, the last update's names in order, its
        error ("Type: message") and when it was raised, whether a hook paused it, how many
        tensors write_into_received overwrote."""
        return {"pid": os.getpid(), "replica_rank": self.replica_rank,
                "rollout_rank": self.rollout_rank, "updates": self.updates,
                "completed": self.completed, "global_steps": self.global_steps,
                "hash": self.hash, "received": list(self.received), "error": self.error,
                "failed_at": self.failed_at, "paused": self.paused, "written": self.written,
                "local_bytes": self.local_bytes}


class CpuCheckpointEngineWorker(CheckpointEngineWorker):
    """verl's CheckpointEngineWorker with a CpuServerAdapter built in the actor.

    replica_rank: as verl's RolloutReplica.get_ray_class_with_init_args passes it; default
    first_replica_rank + this worker's rank in its group // the replica's world size.
    adapter_hooks: CpuServerAdapter.configure() keywords, from the start.
    """

    def __init__(self, rollout_config: Any, model_config: Any, replica_rank: int | None = None,
                 adapter_hooks: dict | None = None, first_replica_rank: int = 0) -> None:
        world = _replica_world_size(rollout_config)
        rank = int(os.environ.get("RANK", 0))  # in the worker group (set by RayWorkerGroup)
        if replica_rank is None:
            replica_rank = first_replica_rank + rank // world
        adapter = CpuServerAdapter(rollout_config, model_config, replica_rank=replica_rank,
                                   rollout_rank=rank % world, **(adapter_hooks or {}))
        super().__init__(rollout_config, model_config, server_adapter=adapter)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def adapter_state(self) -> dict[str, Any]:
        return self.server_adapter.state()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def adapter_weights(self) -> dict[str, torch.Tensor]:
        """A copy of the rollout model's state dict."""
        return {k: v.detach().clone() for k, v in self.server_adapter.model.state_dict().items()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def adapter_local(self) -> dict[str, tuple]:
        """Rank-local: the shards of the last update, name -> (shard, ShardSpec)."""
        return dict(self.server_adapter.local)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def configure_adapter(self, **hooks: Any) -> None:
        self.server_adapter.configure(**hooks)


class CpuRolloutReplica(RolloutReplica):
    """A verl RolloutReplica whose ranks are CpuCheckpointEngineWorker actors (`workers`).

    Build it as verl's (replica_rank, config, model_config), then set `workers` (or call
    init_hybrid(worker_group), which takes this replica's slice). The manager's calls around an
    update are no-ops: no server, no KV cache, no sleep mode on the CPU.
    """

    def __init__(self, replica_rank: int, config: Any, model_config: Any,
                 workers: list | None = None, **kwargs: Any) -> None:
        super().__init__(replica_rank, config, model_config, **kwargs)
        if workers is not None:
            self.workers = list(workers)

    def get_ray_class_with_init_args(self) -> RayClassWithInitArgs:
        return RayClassWithInitArgs(cls=ray.remote(CpuCheckpointEngineWorker),
                                    rollout_config=self.config, model_config=self.model_config,
                                    replica_rank=self.replica_rank)

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        """No HTTP server: the workers are the whole replica."""

    async def wake_up(self) -> None:
        pass

    async def sleep(self) -> None:
        pass

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        pass

    async def resume_generation(self) -> None:
        pass

    async def clear_kv_cache(self) -> None:
        pass

    async def release_kv_cache(self) -> None:
        pass

    async def resume_kv_cache(self) -> None:
        pass


def cpu_rollout_replicas(rollout_config: Any, model_config: Any, num_replicas: int = 1,
                         first_replica_rank: int = 0, adapter_hooks: dict | None = None,
                         name_prefix: str | None = None,
                         worker_cls: type = CpuCheckpointEngineWorker, **worker_kwargs: Any
                         ) -> tuple[RayWorkerGroup, list[CpuRolloutReplica]]:
    """Starts num_replicas replicas of rollout_config's world size (TP x DP x PP) as one Ray
    worker group of `worker_cls` actors (CpuCheckpointEngineWorker or a subclass adding calls
    of its own, given `worker_kwargs` too; one logical CPU each) and returns (worker_group,
    replicas). The workers of one group share a gloo process group, as verl's do
    (CheckpointEngineWorker joins one)."""
    world = _replica_world_size(rollout_config)
    pool = RayResourcePool(process_on_nodes=[num_replicas * world], use_gpu=False,
                           max_colocate_count=1)
    replicas = [CpuRolloutReplica(first_replica_rank + i, rollout_config, model_config)
                for i in range(num_replicas)]
    cls = RayClassWithInitArgs(cls=ray.remote(worker_cls),
                               rollout_config=rollout_config, model_config=model_config,
                               adapter_hooks=adapter_hooks,
                               first_replica_rank=first_replica_rank, **worker_kwargs)
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, use_gpu=False,
                        device_name="cpu", name_prefix=name_prefix)
    for i, replica in enumerate(replicas):
        replica.workers = wg.workers[i * world:(i + 1) * world]
    return wg, replicas


__all__ = ["CpuServerAdapter", "CpuCheckpointEngineWorker", "CpuRolloutReplica",
           "cpu_rollout_replicas", "weight_hash", "WIRE_FORMAT", "RANK_LOCAL_WIRE_FORMAT"]

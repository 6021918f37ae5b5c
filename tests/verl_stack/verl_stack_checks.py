"""Driver-side helpers of the verl-stack tests: the session's Stack and the checks."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ray
import torch

import ferry.verl.checkpoint_engine  # noqa: F401  (registers "ferry" in the driver too)
from ferry.verl.cpu_rollout import cpu_rollout_replicas, weight_hash
from verl.checkpoint_engine.base import CheckpointEngineManager
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig
from verl.workers.engine_workers import TrainingWorkerConfig

from verl_stack_support import FerryTrainingWorker

# engine_kwargs.ferry.timeout_s: a wait for a peer that is alive but silent ends here, so a
# hang fails a test in this time rather than verl's 600 s.
ENGINE_TIMEOUT_S = 30
BUCKET_MB = 1  # the embedding and lm_head (2 MiB each) cross buckets


@dataclass
class Stack:
    """The session's verl stack: configs, trainers by world size, the rollout pool."""

    model_config: Any
    rollout_config: Any
    ce_config: Any
    trainers: dict = field(default_factory=dict)   # world size -> RayWorkerGroup
    replicas: list = field(default_factory=list)   # the current rollout pool
    next_replica_rank: int = 0
    step: int = 0
    groups: list = field(default_factory=list)     # worker groups keep their actors alive

    def next_step(self) -> int:
        self.step += 1
        return self.step

    # -- trainers ---------------------------------------------------------------------------

    def new_trainer(self, world: int, **ferry_kwargs: Any) -> RayWorkerGroup:
        """A trainer worker group of `world` ranks; ferry_kwargs are added to its ranks'
        engine_kwargs.ferry (the rollout ranks keep the session's)."""
        engine = FSDPEngineConfig(forward_only=False, fsdp_size=world, strategy="fsdp2")
        config = TrainingWorkerConfig(
            model_type="language_model", model_config=self.model_config, engine_config=engine,
            optimizer_config=FSDPOptimizerConfig(lr=1e-3, total_training_steps=100))
        ce_config = self.ce_config
        if ferry_kwargs:
            ferry = {**self.ce_config.engine_kwargs["ferry"], **ferry_kwargs}
            ce_config = dataclasses.replace(self.ce_config, engine_kwargs={"ferry": ferry})
        cls = RayClassWithInitArgs(cls=ray.remote(FerryTrainingWorker), config=config,
                                   checkpoint_engine_config=ce_config)
        pool = RayResourcePool(process_on_nodes=[world], use_gpu=False, max_colocate_count=1)
        wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=cls, use_gpu=False,
                            device_name="cpu")
        self.groups.append(wg)
        return wg

    def trainer(self, world: int) -> RayWorkerGroup:
        if world not in self.trainers:
            self.trainers[world] = self.new_trainer(world)
        return self.trainers[world]

    # -- rollouts ---------------------------------------------------------------------------

    def new_replicas(self, count: int) -> list:
        wg, replicas = cpu_rollout_replicas(self.rollout_config, self.model_config, count,
                                            first_replica_rank=self.next_replica_rank)
        self.next_replica_rank += count
        self.groups.append(wg)
        return replicas

    def pool(self, count: int = 2) -> list:
        """The rollout pool, grown to `count` replicas (one rank each)."""
        if len(self.replicas) < count:
            self.replicas.extend(self.new_replicas(count - len(self.replicas)))
        return self.replicas

    def manager(self, trainer: RayWorkerGroup, replicas: list) -> CheckpointEngineManager:
        return CheckpointEngineManager(self.ce_config, trainer, list(replicas))


# -- checks ----------------------------------------------------------------------------------

def workers_of(replicas: list) -> list:
    return [w for r in replicas for w in r.workers]


def trainer_state(trainer: RayWorkerGroup) -> dict[str, torch.Tensor]:
    return trainer.full_state()[0]


def assert_exact(trainer: RayWorkerGroup, replicas: list, global_steps: int,
                 ordered: bool = True) -> str:
    """Every rollout rank of `replicas` holds the trainer's weights byte for byte (every
    name, torch.equal), received them all in the trainer's order (each once, in any order
    where not `ordered`: several senders) in its last update, and completed that update at
    `global_steps`. Returns the weights' hash."""
    expected = trainer_state(trainer)
    digest = weight_hash(expected)
    for worker in workers_of(replicas):
        state = ray.get(worker.adapter_state.remote())
        where = f"rollout replica {state['replica_rank']} (pid {state['pid']})"
        assert state["error"] is None, f"{where}: its last update raised {state['error']}"
        assert state["global_steps"] == global_steps, (
            f"{where}: last complete update is global_steps {state['global_steps']}, "
            f"expected {global_steps}")
        received = state["received"] if ordered else sorted(state["received"])
        assert received == (list(expected) if ordered else sorted(expected)), (
            f"{where}: received {len(state['received'])} tensors, not the trainer's "
            f"{len(expected)} in order: {state['received'][:5]}...")
        weights = ray.get(worker.adapter_weights.remote())
        assert sorted(weights) == sorted(expected), f"{where}: names differ"
        for name, tensor in expected.items():
            got = weights[name]
            assert got.dtype == tensor.dtype and got.shape == tensor.shape, (name, where)
            assert torch.equal(got, tensor), (
                f"{where}: '{name}' differs from the trainer's in "
                f"{int((got != tensor).sum())} of {tensor.numel()} elements")
        assert state["hash"] == digest, f"{where}: weight hash differs"
    return digest


def update(stack: Stack, manager: CheckpointEngineManager) -> int:
    """One update through verl's manager; returns its global_steps."""
    step = stack.next_step()
    manager.update_weights(global_steps=step)
    return step


@dataclass
class Pending:
    """manager.update_weights running in a thread (a hang must not hang the test)."""

    thread: threading.Thread
    started: float
    result: dict = field(default_factory=dict)

    def wait(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        return self.result.get("error")


def start_update(stack: Stack, manager: CheckpointEngineManager) -> Pending:
    step = stack.next_step()
    result: dict = {"step": step}

    def run() -> None:
        try:
            result["metrics"] = manager.update_weights(global_steps=step)
        except BaseException as e:  # the test inspects it
            result["error"] = e
        result["ended"] = time.monotonic()

    thread = threading.Thread(target=run, name=f"update-{step}", daemon=True)
    pending = Pending(thread, time.monotonic(), result)
    thread.start()
    return pending


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def settled(read: Callable[[], dict], since: float, bound: float) -> dict:
    """read() once it has an "error", or at `bound` s after `since` (time.monotonic()):
    verl's manager may raise before the other side records its failure (Ray reports a dead
    actor or a raised task to its ray.get at once; the peer hears of it over ferry's session),
    so a side's error is read once it had its time, not at the manager's return."""
    state = read()
    while state["error"] is None and time.monotonic() < since + bound:
        time.sleep(0.05)
        state = read()
    return state


def kill_pid(pid: int) -> float:
    """SIGKILL (a crash, no cleanup); returns when it was sent (time.monotonic())."""
    os.kill(pid, signal.SIGKILL)
    return time.monotonic()

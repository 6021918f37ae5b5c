"""The trainer side of the verl-stack tests and the helpers the tests share.

Trainer: verl's real FSDP TrainingWorker (strategy fsdp2, on the CPU over gloo), subclassed
as verl's own tests/checkpoint_engine/test_utils.py does: it builds the checkpoint engine and
sends ``self.engine.get_per_tensor_param()[0]`` through it in ``update_weights``. Four things
differ from a GPU run, each because verl 0.9.1 stops on the CPU otherwise:

1. verl has no CPU platform: ``verl_cpu_platform.py`` registers one (VERL_PLATFORM=cpu).
2. ``initialize_global_process_group_ray`` asks for "cpu:gloo,<device>:<backend>", which is
   "cpu:gloo,cpu:gloo" on the CPU (ValueError: Duplicate device type cpu); the worker joins a
   gloo group first, which verl then keeps (it initializes only when none exists).
3. The FSDP engine is registered for cuda and npu only: VERL_ENGINE_DEVICE=cuda picks it
   (every device call it makes goes through the CPU platform).
4. ``strategy="fsdp"`` (FSDP1) refuses CPU parameters with ``sync_module_states=True``
   (ValueError: The module has CPU parameters or buffers when `sync_module_states=True`, which
   requires them to be on GPU), and ``forward_only=True`` forces FSDP2's
   ``CPUOffloadPolicy(pin_memory=True)`` (RuntimeError: Cannot access accelerator device when
   none is available): so fsdp2 with an optimizer, which also gives a real AdamW step between
   updates. HFModelConfig asks for flash_attention_2: overridden to eager.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from verl.checkpoint_engine import CheckpointEngineRegistry
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.import_utils import import_external_libs
from verl.workers.engine_workers import TrainingWorker


class FerryTrainingWorker(TrainingWorker):
    """verl's TrainingWorker with a checkpoint engine (module docstring) and test hooks."""

    def __init__(self, config: Any, checkpoint_engine_config: Any) -> None:
        if not dist.is_initialized():  # (2) in the module docstring
            dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                                    world_size=int(os.environ["WORLD_SIZE"]))
        super().__init__(config)
        self.engine.initialize()  # what TrainingWorker.reset() does
        ce = checkpoint_engine_config
        import_external_libs(ce.custom_backend_module or None)  # as ActorRolloutRefWorker
        self.checkpoint_engine = CheckpointEngineRegistry.new(
            ce.backend, is_master=(dist.get_rank() == 0),
            bucket_size=ce.update_weights_bucket_megabytes << 20,
            **ce.engine_kwargs.get(ce.backend, {}))
        self.updates = 0
        self.reuse_buffer = False
        self.pause_on_update: int | None = None
        self.pause_after_tensors = 1
        self.pause_rank: int | None = None  # the rank that pauses; None: every rank
        self.paused = False
        self.reused = 0  # tensors yielded from the reused buffer, over all updates
        self.error: str | None = None
        self.failed_at: float | None = None
        self.seconds: float | None = None

    # -- what verl's manager calls --------------------------------------------------------

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto"):
        self.updates += 1
        self.error = self.failed_at = None
        per_tensor_param, _ = self.engine.get_per_tensor_param()
        start = time.monotonic()
        try:
            metrics = await self.checkpoint_engine.send_weights(
                self._hooked(per_tensor_param, self.updates), global_steps=global_steps)
        except BaseException as e:
            self.error, self.failed_at = f"{type(e).__name__}: {e}", time.monotonic()
            raise
        self.seconds = time.monotonic() - start
        return metrics or {}

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args, **kwargs):
        return getattr(self.checkpoint_engine, method)(*args, **kwargs)

    # -- test hooks -------------------------------------------------------------------------

    async def _hooked(self, weights, update: int):
        """verl's generator, optionally as views of one buffer refilled for every tensor (as
        a trainer that stages each tensor in one bucket), optionally pausing (event loop
        free) after pause_after_tensors tensors of update pause_on_update, until killed."""
        buffer = None
        count = 0
        for name, tensor in weights:
            if self.reuse_buffer:
                if buffer is None:
                    buffer = torch.empty(self._largest_bytes(), dtype=torch.uint8)
                nbytes = tensor.numel() * tensor.element_size()
                view = buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
                view.copy_(tensor)
                tensor = view
                self.reused += 1
            yield name, tensor
            count += 1
            if (update == self.pause_on_update and count == self.pause_after_tensors
                    and self.pause_rank in (None, dist.get_rank())):
                self.paused = True
                while True:
                    await asyncio.sleep(0.05)

    def _largest_bytes(self) -> int:
        return max(p.numel() * p.element_size() for p in self.engine.module.state_dict().values())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def configure(self, reuse_buffer: bool = False, pause_on_update: int | None = None,
                  pause_after_tensors: int = 1, pause_rank: int | None = None) -> None:
        self.reuse_buffer = reuse_buffer
        self.pause_on_update = pause_on_update
        self.pause_after_tensors = pause_after_tensors
        self.pause_rank = pause_rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def record(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "rank": dist.get_rank(), "updates": self.updates,
                "error": self.error, "failed_at": self.failed_at, "paused": self.paused,
                "seconds": self.seconds, "reused": self.reused}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def full_state(self) -> dict[str, torch.Tensor] | None:
        """The full weights as get_per_tensor_param gives them (every rank joins its
        gathers), in its order; rank 0 returns them, the others None."""
        per_tensor_param, _ = self.engine.get_per_tensor_param()
        state = {name: t.detach().to("cpu", copy=True) for name, t in per_tensor_param}
        return state if dist.get_rank() == 0 else None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def optimizer_step(self, seed: int) -> float:
        """One real training step of verl's FSDP module and optimizer (AdamW): next-token
        cross-entropy on a fixed random batch."""
        module = self.engine.module
        module.train()
        generator = torch.Generator().manual_seed(seed)
        vocab = module.config.vocab_size
        ids = torch.randint(0, vocab, (2, 12), generator=generator)
        logits = module(input_ids=ids).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab),
                                                 ids[:, 1:].reshape(-1))
        loss.backward()
        self.engine.optimizer.step()
        self.engine.optimizer.zero_grad(set_to_none=True)
        return float(loss)

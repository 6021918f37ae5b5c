"""A rollout process: receives the trainer's weights through ferry's verl checkpoint-engine
backend, as a verl rollout rank does, and samples completions with them.

It answers the commands the trainer sends over its pipe with ("ok", result) or
("error", message); see Rollout in train.py for the other end."""

from __future__ import annotations

import asyncio
import time
import traceback

import torch

from model import ModelConfig, TinyGPT, sample, weight_hash
from task import AdditionTask


async def _load_weights(engine, model: TinyGPT, step: int) -> dict:
    """Copies every received tensor into the model's parameter of that name, as verl's
    load_weights does (the engine's tensors are views it reuses for the next bucket)."""
    start = time.monotonic()
    params = model.state_dict()
    received = set()
    async for name, tensor in engine.receive_weights(global_steps=step):
        if name not in params:
            raise KeyError(f"received tensor '{name}' is not a parameter of the rollout model")
        params[name].copy_(tensor)
        received.add(name)
    missing = sorted(set(params) - received)
    if missing:
        raise KeyError(f"update for step {step} lacks parameters {missing}")
    return {"hash": weight_hash(model), "seconds": time.monotonic() - start}


def rollout_main(conn, rank: int, config: dict) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(1000 + rank)  # unlike the trainer's: only the sync makes them equal
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine

    task = AdditionTask(config["max_operand"])
    model = TinyGPT(ModelConfig(**config["model"])).eval()
    engine = FerryCheckpointEngine(config["bucket_bytes"], is_master=False,
                                   **config["engine_kwargs"])
    while True:
        command, *args = conn.recv()
        try:
            if command == "prepare":
                result = engine.prepare()
            elif command == "init":
                result = engine.init_process_group(**args[0])
            elif command == "receive":
                result = asyncio.run(_load_weights(engine, model, args[0]))
            elif command == "finalize":
                result = engine.finalize()
            elif command == "generate":
                step, operands, group = args
                generator = torch.Generator().manual_seed(config["seed"] * 1_000_003 +
                                                          step * 2 + rank)
                prompts = task.prompts(operands).repeat_interleave(group, dim=0)
                result = sample(model, prompts, task.answer_digits, generator)
            elif command == "exit":
                engine.close()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command '{command}'")
            conn.send(("ok", result))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))

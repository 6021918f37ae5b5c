"""A tiny GRPO run through ferry: one trainer process (this one) and two rollout processes.

Each step the trainer's weights go to both rollouts through ferry's verl checkpoint-engine
backend, driven in the order of verl's CheckpointEngineManager (prepare -> build_topology ->
init_process_group -> send_weights beside receive_weights -> finalize); the rollouts sample
answers to "a+b=" with them and send the samples back over their pipes; the trainer scores
them and takes one GRPO step. Every step checks that each rollout's weight hash equals the
trainer's. docs/quickstart.md describes the run.

    PYTHONPATH=build/python python3 examples/grpo_tiny/train.py [--steps N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import time

import torch

import curve
import grpo
from model import ModelConfig, TinyGPT, weight_hash
from rollout import rollout_main
from task import VOCAB, AdditionTask

ROLLOUTS = 2
ANSWER_TIMEOUT_S = 120.0


class Rollout:
    """The trainer's handle on one rollout process."""

    def __init__(self, rank: int, config: dict) -> None:
        self.rank = rank
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=rollout_main, args=(child, rank, config), daemon=True)
        self.proc.start()

    def send(self, *command) -> None:
        self.conn.send(command)

    def answer(self):
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not self.conn.poll(0.1):
            if not self.proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"rollout {self.rank}: no answer (process alive: "
                                   f"{self.proc.is_alive()}, exit code {self.proc.exitcode})")
        kind, result = self.conn.recv()
        if kind != "ok":
            raise RuntimeError(f"rollout {self.rank} failed: {result}")
        return result

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                self.send("exit")
                self.answer()
            except (RuntimeError, OSError):
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


def sync_weights(engine, model: TinyGPT, rollouts: list[Rollout], step: int) -> dict:
    """One weight update in the order of verl's CheckpointEngineManager; returns the rollouts'
    weight hashes and the update's metrics."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine

    start = time.monotonic()
    for r in rollouts:
        r.send("prepare")
    metadata = [engine.prepare()] + [r.answer() for r in rollouts]
    trainer_kwargs, rollout_kwargs = FerryCheckpointEngine.build_topology(
        1, len(rollouts), metadata)
    for r in rollouts:  # rollouts join while the master serves (its init waits for them)
        r.send("init", {key: values[r.rank] for key, values in rollout_kwargs.items()})
    engine.init_process_group(**{key: values[0] for key, values in trainer_kwargs.items()})
    for r in rollouts:
        r.answer()
        r.send("receive", step)
    weights = ((name, tensor.detach()) for name, tensor in model.state_dict().items())
    metrics = asyncio.run(engine.send_weights(weights, global_steps=step))
    received = [r.answer() for r in rollouts]
    for r in rollouts:
        r.send("finalize")
    engine.finalize()
    for r in rollouts:
        r.answer()
    return {"seconds": time.monotonic() - start, "bytes": metrics["ferry/bytes"],
            "hashes": [x["hash"] for x in received]}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="GRPO steps (default 60)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (default 16)")
    p.add_argument("--group", type=int, default=8, help="samples per prompt (default 8)")
    p.add_argument("--warmup", type=int, default=15,
                   help="supervised warm-up steps of 128 examples before RL (default 15)")
    p.add_argument("--max-operand", type=int, default=9, help="a, b in 0..N (default 9)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument("--width", type=int, default=64, help="transformer width (default 64)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--bucket-kib", type=int, default=256,
                   help="ferry bucket in KiB (default 256: an update spans two buckets)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-rise", type=float, default=0.1,
                   help="exit 1 unless the mean reward of the last fifth of the steps beats "
                        "the first fifth's by this much (default 0.1)")
    p.add_argument("--json", help="write every step's numbers to this file")
    p.add_argument("--png", default="grpo_tiny_reward.png",
                   help="reward curve PNG (default ./grpo_tiny_reward.png; '' for none)")
    args = p.parse_args(argv)
    for name in ("steps", "prompts", "group", "width", "layers", "bucket_kib"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.group < 2:
        p.error("--group must be at least 2: advantages compare samples within a group")
    try:
        AdditionTask(args.max_operand)
    except ValueError as e:
        p.error(f"--max-operand: {e}")
    if args.prompts < ROLLOUTS:
        p.error(f"--prompts must be at least {ROLLOUTS}, one share per rollout")
    return args


def warm_up(model: TinyGPT, optimizer, task: AdditionTask, steps: int,
            generator: torch.Generator) -> None:
    for _ in range(steps):
        operands = task.sample_operands(128, generator)
        loss = grpo.supervised_loss(model, task.prompts(operands), task.answers(operands))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def grpo_step(model: TinyGPT, optimizer, task: AdditionTask, rollouts: list[Rollout],
              operands: torch.Tensor, group: int, step: int) -> float:
    """The rollouts sample `group` answers per prompt (each for its share of the prompts);
    the trainer scores them and takes one policy-gradient step. Returns the mean reward."""
    for r, share in zip(rollouts, operands.tensor_split(len(rollouts))):
        r.send("generate", step, share, group)
    completions = torch.cat([r.answer() for r in rollouts])
    repeated = operands.repeat_interleave(group, dim=0)
    correct = task.correct_digits(repeated, completions)
    loss = grpo.policy_loss(model, task.prompts(repeated), completions,
                            grpo.group_advantages(correct, group))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return correct.mean().item()


def rise(rewards: list[float]) -> tuple[float, float]:
    """Mean reward of the first and of the last fifth of the steps (at least one each)."""
    k = max(1, len(rewards) // 5)
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # deterministic, and kind to a shared machine
    torch.manual_seed(args.seed)
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine

    task = AdditionTask(args.max_operand)
    model_config = ModelConfig(vocab=VOCAB, max_len=task.prompt_len + task.answer_digits,
                               width=args.width, layers=args.layers)
    model = TinyGPT(model_config)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    engine_kwargs = {"timeout_s": 60.0, "round_bytes": 4 << 20}
    config = {"max_operand": args.max_operand, "model": vars(model_config),
              "bucket_bytes": args.bucket_kib << 10, "engine_kwargs": engine_kwargs,
              "seed": args.seed}
    params = sum(p.numel() for p in model.parameters())
    print(f"grpo_tiny: {params} parameters, a+b for a, b in 0..{args.max_operand}, "
          f"{args.prompts} prompts x {args.group} samples per step, {ROLLOUTS} rollout "
          f"processes, ferry bucket {args.bucket_kib} KiB", flush=True)

    started = time.monotonic()
    rollouts = [Rollout(rank, config) for rank in range(ROLLOUTS)]  # start during the warm-up
    engine = FerryCheckpointEngine(config["bucket_bytes"], is_master=True, **engine_kwargs)
    records = []
    try:
        if args.warmup:
            warm_up(model, optimizer, task, args.warmup, generator)
            print(f"warm-up (supervised, not RL): {args.warmup} steps of 128 examples, "
                  f"{time.monotonic() - started:.1f} s; RL starts from there", flush=True)
        for step in range(1, args.steps + 1):
            synced = sync_weights(engine, model, rollouts, step)
            expected = weight_hash(model)
            bad = [i for i, h in enumerate(synced["hashes"]) if h != expected]
            if bad:
                print(f"step {step}: WEIGHT HASH MISMATCH on rollout(s) {bad}: trainer "
                      f"{expected[:16]}, rollouts {[h[:16] for h in synced['hashes']]}",
                      file=sys.stderr, flush=True)
                return 1
            operands = task.sample_operands(args.prompts, generator)
            reward = grpo_step(model, optimizer, task, rollouts, operands, args.group, step)
            records.append({"step": step, "reward": reward, "sync_seconds": synced["seconds"],
                            "sync_bytes": synced["bytes"], "hash_ok": True})
            print(f"step {step:3d}  reward {reward:.3f}  sync {synced['seconds']:.3f} s "
                  f"{synced['bytes'] / 1e6:.2f} MB  hash ok ({ROLLOUTS}/{ROLLOUTS} rollouts = "
                  f"trainer {expected[:12]})  {time.monotonic() - started:.0f} s", flush=True)
        sessions_built = engine.sessions_built  # 1: the first update's sessions were kept
    finally:
        for r in rollouts:
            r.stop()
        engine.close()

    rewards = [r["reward"] for r in records]
    first, last = rise(rewards)
    print(curve.text_curve(rewards))
    if args.png:
        print(curve.save_png(rewards, args.png,
                             f"grpo_tiny: a+b, {args.prompts}x{args.group} samples per step"))
    risen = last - first >= args.min_rise
    print(f"reward: first fifth {first:.3f} -> last fifth {last:.3f} "
          f"({'rose' if risen else 'DID NOT RISE'} by {last - first:+.3f}, needed "
          f"{args.min_rise:+.3f}); every step's rollout weights matched the trainer's; "
          f"ferry sessions built {sessions_built}x; {time.monotonic() - started:.0f} s",
          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": records, "first": first, "last": last,
                       "sessions_built": sessions_built, "args": vars(args)}, f,
                      indent=1)
    return 0 if risen else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

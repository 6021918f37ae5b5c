"""A tiny GRPO run through ferry on verl's own weight-update path, with real Ray.

The policy is a tiny transformers Qwen2 model. The trainer is a verl single-controller worker
(trainer.py, a Ray actor); two rollouts are verl CheckpointEngineWorker actors with ferry's
CPU server adapter (rollout.py). Each step verl's CheckpointEngineManager.update_weights()
sends the trainer's state_dict to both rollouts through ferry's checkpoint-engine backend;
every rollout's weight hash must then equal the trainer's; the rollouts sample answers to
"a+b=" with the weights they received and the trainer takes one GRPO step on them.
docs/quickstart.md describes the run.

    PYTHONPATH=build/python .venv/bin/python examples/grpo_tiny/train.py [--steps N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

EXAMPLE_DIR = os.path.dirname(os.path.abspath(__file__))
# Ray's workers import this example's modules by name (and ferry from the same PYTHONPATH);
# no model or tokenizer comes from the hub; verl's warnings that there is no GPU stay quiet.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [EXAMPLE_DIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VERL_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

import curve  # noqa: E402
from model import qwen2_config  # noqa: E402
from task import VOCAB, AdditionTask  # noqa: E402

ROLLOUTS = 2


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="GRPO steps (default 100)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step (default 16)")
    p.add_argument("--group", type=int, default=8, help="samples per prompt (default 8)")
    p.add_argument("--warmup", type=int, default=15,
                   help="supervised warm-up steps of 128 examples before RL (default 15)")
    p.add_argument("--max-operand", type=int, default=9, help="a, b in 0..N (default 9)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    p.add_argument("--width", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--bucket-mib", type=int, default=1,
                   help="verl's update_weights_bucket_megabytes (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-rise", type=float, default=0.1,
                   help="exit 1 unless the mean reward of the last fifth of the steps beats "
                        "the first fifth's by this much (default 0.1)")
    p.add_argument("--json", help="write every step's numbers to this file")
    p.add_argument("--png", default="grpo_tiny_reward.png",
                   help="reward curve PNG (default ./grpo_tiny_reward.png; '' for none)")
    args = p.parse_args(argv)
    for name in ("steps", "prompts", "group", "layers", "bucket_mib"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.width < 8 or args.width % 4:
        p.error("--width must be a multiple of 4 (its 4 attention heads), at least 8")
    if args.group < 2:
        p.error("--group must be at least 2: advantages compare samples within a group")
    try:
        AdditionTask(args.max_operand)
    except ValueError as e:
        p.error(f"--max-operand: {e}")
    if args.prompts < ROLLOUTS:
        p.error(f"--prompts must be at least {ROLLOUTS}, one share per rollout")
    return args


def start(args: argparse.Namespace, model_dir: str):
    """Ray, the trainer's worker group, the rollouts' and verl's CheckpointEngineManager."""
    import ray
    from verl.checkpoint_engine.base import CheckpointEngineManager
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.workers.config import CheckpointEngineConfig, HFModelConfig, RolloutConfig

    from rollout import start_rollouts
    from trainer import TrainerWorker

    # A Ray of its own (never one already running), one logical CPU per actor.
    ray.init(address="local", num_cpus=1 + ROLLOUTS, include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    # What verl reads from actor_rollout_ref.rollout.checkpoint_engine (docs/verl.md).
    engine_config = CheckpointEngineConfig(
        backend="ferry", custom_backend_module="ferry.verl.checkpoint_engine",
        update_weights_bucket_megabytes=args.bucket_mib,
        engine_kwargs={"ferry": {"timeout_s": 60.0, "round_bytes": 4 << 20}})
    rollout_config = RolloutConfig(name="cpu", tensor_model_parallel_size=1,
                                   load_format="dummy", checkpoint_engine=engine_config)
    model_config = HFModelConfig(path=model_dir, load_tokenizer=False)

    trainer = RayWorkerGroup(
        resource_pool=RayResourcePool(process_on_nodes=[1], use_gpu=False, max_colocate_count=1),
        ray_cls_with_init=RayClassWithInitArgs(
            cls=ray.remote(TrainerWorker), model_path=model_dir, engine_config=engine_config,
            max_operand=args.max_operand, lr=args.lr, seed=args.seed),
        use_gpu=False, device_name="cpu", name_prefix="trainer")
    rollouts, replicas = start_rollouts(ROLLOUTS, rollout_config, model_config,
                                        args.max_operand, args.seed)
    return trainer, rollouts, CheckpointEngineManager(engine_config, trainer, replicas)


def rise(rewards: list[float]) -> tuple[float, float]:
    """Mean reward of the first and of the last fifth of the steps (at least one each)."""
    k = max(1, len(rewards) // 5)
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k


def run(args: argparse.Namespace, model_dir: str, started: float) -> tuple[list, dict] | None:
    """The GRPO steps; their records and the trainer's state, or None on a hash mismatch."""
    trainer, rollouts, manager = start(args, model_dir)
    task = AdditionTask(args.max_operand)
    generator = torch.Generator().manual_seed(args.seed)
    if args.warmup:
        trainer.warm_up(args.warmup)
    print(f"Ray and its {1 + ROLLOUTS} actors started; warm-up (supervised, not RL): "
          f"{args.warmup} steps of 128 examples; {time.monotonic() - started:.1f} s; RL starts "
          f"from there", flush=True)
    records = []
    for step in range(1, args.steps + 1):
        sync_start = time.monotonic()
        metrics = manager.update_weights(global_steps=step)
        sync_seconds = time.monotonic() - sync_start
        expected = trainer.state()[0]["hash"]
        adapters = rollouts.adapter_state()  # each rollout's weight hash and last update's step
        if any(a["hash"] != expected or a["global_steps"] != step for a in adapters):
            print(f"step {step}: WEIGHT HASH MISMATCH: trainer {expected[:16]}, rollouts "
                  f"{[(a['hash'][:16], a['global_steps']) for a in adapters]}",
                  file=sys.stderr, flush=True)
            return None
        operands = task.sample_operands(args.prompts, generator)
        shares = list(operands.tensor_split(ROLLOUTS))
        completions = torch.cat(rollouts.generate(shares, [args.group] * ROLLOUTS,
                                                  [step] * ROLLOUTS))
        reward = trainer.learn(operands, completions, args.group)[0]
        records.append({"step": step, "reward": reward, "sync_seconds": sync_seconds,
                        "sync_bytes": metrics["ferry/bytes"], "hash_ok": True})
        print(f"step {step:3d}  reward {reward:.3f}  sync {sync_seconds:.3f} s "
              f"{metrics['ferry/bytes'] / 1e6:.2f} MB  hash ok ({ROLLOUTS}/{ROLLOUTS} rollouts = "
              f"trainer {expected[:12]})  {time.monotonic() - started:.0f} s", flush=True)
    return records, trainer.state()[0]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    torch.set_num_threads(1)
    task = AdditionTask(args.max_operand)
    config = qwen2_config(VOCAB, task.prompt_len + task.answer_digits, args.width, args.layers)
    print(f"grpo_tiny: Qwen2 ({args.layers} layers, hidden {args.width}), a+b for a, b in "
          f"0..{args.max_operand}, {args.prompts} prompts x {args.group} samples per step, "
          f"{ROLLOUTS} rollouts, verl CheckpointEngineManager + ferry, bucket "
          f"{args.bucket_mib} MiB", flush=True)
    import ray
    with tempfile.TemporaryDirectory(prefix="grpo_tiny-") as model_dir:
        config.save_pretrained(model_dir)  # the config.json verl's HFModelConfig reads
        try:
            result = run(args, model_dir, started)
        finally:
            ray.shutdown()
    if result is None:
        return 1
    records, trainer_state = result

    rewards = [r["reward"] for r in records]
    first, last = rise(rewards)
    print(curve.text_curve(rewards))
    if args.png:
        print(curve.save_png(rewards, args.png,
                             f"grpo_tiny: a+b, {args.prompts}x{args.group} samples per step"))
    risen = last - first >= args.min_rise
    print(f"reward: first fifth {first:.3f} -> last fifth {last:.3f} "
          f"({'rose' if risen else 'DID NOT RISE'} by {last - first:+.3f}, needed "
          f"{args.min_rise:+.3f}); every step's rollout weights matched the trainer's "
          f"({trainer_state['parameters']} parameters); ferry sessions built "
          f"{trainer_state['sessions_built']}x; {time.monotonic() - started:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": records, "first": first, "last": last,
                       "sessions_built": trainer_state["sessions_built"],
                       "parameters": trainer_state["parameters"], "args": vars(args)}, f,
                      indent=1)
    return 0 if risen else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

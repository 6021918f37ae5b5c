"""The quick start's GRPO run (examples/grpo_tiny), shortened: a Qwen2 trainer and two rollouts
as Ray actors, every step's weights sent by verl's CheckpointEngineManager through ferry; every
step the rollouts' weights must hash equal to the trainer's, and the reward must rise under RL."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("ray", "verl", "transformers")),
    reason="the quick start needs ferry's Python environment (scripts/python-env.sh)")

EXAMPLE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "grpo_tiny")
EXAMPLE = os.path.join(EXAMPLE_DIR, "train.py")
STEPS = 25
# The seeded run's reward rises by 0.14 from the first to the last fifth of its steps (0.25 to
# 0.39); a broken sync or loss leaves it flat or falling.
MIN_RISE = 0.08
RUN_TIMEOUT_S = 300


def _example(module: str):
    """A module of examples/grpo_tiny (they import each other by plain name)."""
    sys.path.insert(0, EXAMPLE_DIR)
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(EXAMPLE_DIR)


def test_short_grpo_run_matches_weights_every_step_and_raises_the_reward(tmp_path):
    out = tmp_path / "run.json"
    png = tmp_path / "reward.png"
    run = subprocess.run(
        [sys.executable, EXAMPLE, "--steps", str(STEPS), "--min-rise", "0", "--json", str(out),
         "--png", str(png)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=os.environ.copy())
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    steps = result["steps"]
    assert result["sessions_built"] == 1, "the first update's ferry sessions serve every step"
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["hash_ok"] for s in steps)
    assert run.stdout.count("hash ok (2/2 rollouts") == STEPS, run.stdout
    model_bytes = steps[0]["sync_bytes"]
    assert model_bytes >= 4 * result["parameters"]
    assert all(s["sync_bytes"] == model_bytes for s in steps)

    rewards = [s["reward"] for s in steps]
    k = STEPS // 5
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    assert last - first >= MIN_RISE, f"reward did not rise: {rewards}"
    assert "reward (0 to 1) per step" in run.stdout
    assert png.stat().st_size > 0


def test_weight_hash_tells_one_changed_parameter_apart(tmp_path):
    """The per-step check is only as good as the hash: equal weights hash equal, one changed
    element in any tensor of the state_dict does not."""
    from ferry.verl.cpu_rollout import weight_hash
    model = _example("model")
    model.qwen2_config(vocab=12, max_len=6, width=16, layers=1).save_pretrained(tmp_path)
    torch.manual_seed(0)
    trainer = model.new_model(str(tmp_path))
    torch.manual_seed(1)
    rollout = model.new_model(str(tmp_path))
    assert weight_hash(rollout.state_dict()) != weight_hash(trainer.state_dict())
    rollout.load_state_dict(trainer.state_dict())
    assert weight_hash(rollout.state_dict()) == weight_hash(trainer.state_dict())
    for name, tensor in rollout.state_dict().items():
        flat = tensor.view(-1)
        kept = flat[-1].item()
        flat[-1] = kept + 1.0
        assert weight_hash(rollout.state_dict()) != weight_hash(trainer.state_dict()), name
        flat[-1] = kept
        assert weight_hash(rollout.state_dict()) == weight_hash(trainer.state_dict()), name


def test_advantages_are_relative_to_the_group_and_credit_later_digits():
    grpo = _example("grpo")
    # Three prompts, groups of 3, two digits. Prompt 0: only sample 0 has the first digit
    # right, all have the second. Prompt 1: only sample 0 has the second digit right.
    # Prompt 2: all samples alike.
    correct = torch.tensor([[1., 1.], [0., 1.], [0., 1.],
                            [1., 1.], [1., 0.], [1., 0.],
                            [0., 1.], [0., 1.], [0., 1.]])
    advantages = grpo.group_advantages(correct, group=3)
    assert advantages[0, 0] > 0 > advantages[1, 0]  # right beats wrong within the group
    assert torch.allclose(advantages[1], advantages[2])
    assert torch.all(advantages[:3, 1] == 0)  # a digit all got right teaches nothing
    assert torch.all(advantages[6:] == 0)  # nor does a group of equal samples
    # A token is credited with its own digit's and the later digits' rewards.
    assert torch.allclose(advantages[3:6, 0], advantages[3:6, 1])
    assert advantages[3, 0] > 0 > advantages[4, 0]

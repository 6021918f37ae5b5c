"""The quick start's GRPO run (examples/grpo_tiny), shortened: every step the rollouts' weights,
received through ferry's verl checkpoint-engine backend, must hash equal to the trainer's, and
the reward must rise under RL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "grpo_tiny", "train.py")
STEPS = 25
# The seeded run's reward rises by 0.18 from the first to the last fifth of its steps (0.31 to
# 0.48: RL learns the carry digit); a broken sync or loss leaves it flat or falling.
MIN_RISE = 0.08
RUN_TIMEOUT_S = 300


def test_short_grpo_run_matches_weights_every_step_and_raises_the_reward(tmp_path):
    out = tmp_path / "run.json"
    png = tmp_path / "reward.png"
    run = subprocess.run(
        [sys.executable, EXAMPLE, "--steps", str(STEPS), "--min-rise", "0", "--json", str(out),
         "--png", str(png)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=os.environ.copy())
    assert run.returncode == 0, run.stdout + run.stderr
    steps = json.loads(out.read_text())["steps"]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all(s["hash_ok"] for s in steps)
    assert run.stdout.count("hash ok (2/2 rollouts") == STEPS, run.stdout
    model_bytes = steps[0]["sync_bytes"]
    assert model_bytes > 0 and all(s["sync_bytes"] == model_bytes for s in steps)

    rewards = [s["reward"] for s in steps]
    k = STEPS // 5
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    assert last - first >= MIN_RISE, f"reward did not rise: {rewards}"
    assert "reward (0 to 1) per step" in run.stdout

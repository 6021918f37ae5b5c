#!/usr/bin/env bash
# The quick start: a tiny GRPO run (examples/grpo_tiny) on real Ray and verl: a Qwen2 trainer
# actor sends its weights to two rollout actors through verl's CheckpointEngineManager and
# ferry's checkpoint-engine backend every step. Runs on ferry's Python environment (.venv, made
# by scripts/install-deps.sh -> scripts/python-env.sh; FERRY_PYTHON overrides it); sets it up
# and builds ferry first where that environment or build/'s Python module is missing. Exits
# non-zero when a rollout's weights differ from the trainer's or the reward does not rise.
# Extra arguments go to train.py (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FERRY_BUILD_DIR:-build}
python=${FERRY_PYTHON:-.venv/bin/python}
if [ ! -x "$python" ] || ! compgen -G "$build_dir/python/ferry/_ferry*.so" >/dev/null; then
  echo "quickstart: no $python or no ferry Python module in $build_dir; setting them up"
  bash scripts/install-deps.sh
  FERRY_BUILD_DIR="$build_dir" bash scripts/build.sh
fi
PYTHONPATH="$PWD/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" \
  exec "$python" examples/grpo_tiny/train.py --png "$build_dir/grpo_tiny_reward.png" "$@"

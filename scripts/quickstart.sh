#!/usr/bin/env bash
# The quick start: a tiny GRPO run (examples/grpo_tiny) whose trainer sends its weights to two
# rollout processes through ferry's verl checkpoint-engine backend every step. Builds ferry
# first where build/ lacks the Python module (after the README's setup: scripts/demo.sh or
# scripts/install-deps.sh). Exits non-zero when a rollout's weights differ from the trainer's
# or the reward does not rise. Extra arguments go to train.py (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FERRY_BUILD_DIR:-build}
python=${FERRY_PYTHON:-/usr/bin/python3}
if ! compgen -G "$build_dir/python/ferry/_ferry*.so" >/dev/null; then
  echo "quickstart: $build_dir has no ferry Python module; building it"
  bash scripts/install-deps.sh
  FERRY_BUILD_DIR="$build_dir" bash scripts/build.sh
fi
PYTHONPATH="$PWD/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}" \
  exec "$python" examples/grpo_tiny/train.py --png "$build_dir/grpo_tiny_reward.png" "$@"

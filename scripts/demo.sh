#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds ferry, and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
FERRY_BUILD_DIR=build bash scripts/build.sh
ferry=build/src/cli/ferry
if "$ferry" demo --help >/dev/null 2>&1; then
  exec "$ferry" demo "$@"
fi
# Until the sync engine lands: a model whose embedding is the FAQ's [151936, 4096] fp32
# tensor, and the bucket verl would need for it.
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$ferry" gen-model --preset qwen3-8b --layers 1 --dtype fp32 --out "$out/model"
"$ferry" advise-bucket "$out/model"

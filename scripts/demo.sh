#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds ferry, and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
FERRY_BUILD_DIR=build bash scripts/build.sh
exec build/src/cli/ferry demo "$@"

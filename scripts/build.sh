#!/usr/bin/env bash
# Configures and builds ferry into build/ (or $FERRY_BUILD_DIR), Release with warnings as errors.
# Extra arguments go to cmake, e.g. scripts/build.sh -DFERRY_SANITIZE=address
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${FERRY_BUILD_DIR:-build}
# Debian's cmake (what install-deps.sh installs), not a pip-installed cmake earlier on PATH.
cmake=${FERRY_CMAKE:-$(command -v /usr/bin/cmake || command -v cmake)}
"$cmake" -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${FERRY_BUILD_TYPE:-RelWithDebInfo} \
  -DFERRY_WERROR=ON "$@" >/dev/null
ninja -C "$build_dir" -j"${FERRY_JOBS:-$(nproc)}"

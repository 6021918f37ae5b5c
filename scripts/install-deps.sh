#!/usr/bin/env bash
# Installs ferry's build and test dependencies from Debian's packages (Debian 12).
# Idempotent: packages already present are skipped, so a second run is quick.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libxxhash-dev libyaml-cpp-dev libzstd-dev
  libucx-dev ucx-utils libssl-dev
  pybind11-dev python3-pybind11 python3-numpy python3-pytest python3-torch
  clang clang-format libclang-rt-14-dev iproute2 procps
  # packaging: pip install . (tests/install), the man page, bench/plot.py
  python3-setuptools python3-wheel python3-venv python3-build help2man python3-matplotlib
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: must run as root to install packages (or install them yourself)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"

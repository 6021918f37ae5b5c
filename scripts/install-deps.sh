#!/usr/bin/env bash
# Installs ferry's build and test dependencies: Debian's packages (Debian 12) for the C++ build,
# then the pinned Python environment in .venv (scripts/python-env.sh: torch, verl, Ray, ...).
# Idempotent: packages already present are skipped, so a second run is quick.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libxxhash-dev libyaml-cpp-dev libzstd-dev
  libucx-dev ucx-utils libssl-dev
  python3-dev python3-venv
  clang clang-format libclang-rt-14-dev iproute2 procps
  # scripts/round_units.py (structure.round_units): the files one round crosses
  valgrind
  # packaging: pip install . (tests/install), the man page
  python3-setuptools python3-wheel help2man
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: must run as root to install packages (or install them yourself)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
bash "$(dirname "$0")/python-env.sh"

#!/usr/bin/env bash
# Makes ferry's Python environment in .venv (or $FERRY_VENV): a virtual environment of a
# Python 3.11 (torch 2.13.0's CPU build is a cp311 wheel) with the pinned packages of
# python/requirements.txt, every transitive version fixed by python/constraints.txt.
# The build (scripts/build.sh) compiles the extension for this interpreter with its pybind11,
# and every Python test runs on it. Idempotent: a venv whose pins are already installed is
# kept (a stamp holds the hash of the two files).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${FERRY_VENV:-.venv}
base=${FERRY_BASE_PYTHON:-$(command -v python3.11 || command -v python3)}
stamp=$venv/.ferry-requirements
want=$(cat python/requirements.txt python/constraints.txt | sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "python-env: $venv up to date ($("$venv/bin/python" --version))"
  exit 0
fi
version=$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != 3.11 ]; then
  echo "python-env: $base is Python $version; ferry's pins need 3.11 (set FERRY_BASE_PYTHON)" >&2
  exit 1
fi
[ -x "$venv/bin/python" ] || "$base" -m venv "$venv"
# PIP_CONSTRAINT adds to (not replaces) a machine's own constraints.
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  -r python/requirements.txt -c python/constraints.txt
echo "$want" >"$stamp"
echo "python-env: $venv ready ($("$venv/bin/python" --version), torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'))"

#!/usr/bin/env bash
# `pip install . --no-build-isolation` (offline) into a fresh venv that sees the system's
# packages, as docs/python.md tells users; then ferry imports from the venv, runs a call into
# libferry, and its version, importlib.metadata's and CMake's project version are one.
#   check_pip_install.sh SOURCE_DIR EXPECTED_VERSION [PYTHON]
# setup.py's FERRY_CMAKE_* variables pass through: ctest sets FERRY_CMAKE_PREBUILT to its own
# build (tests.cmake); without any, pip configures and compiles it all, as a user's would.
set -euo pipefail
source_dir=$1
expected=$2
python=${3:-/usr/bin/python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH  # ferry must come from the venv, not a build tree
"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --no-build-isolation --no-index --quiet "$source_dir"
cd "$work"
"$work/venv/bin/python" -c "import ferry; print(ferry.__version__)"
"$work/venv/bin/python" - "$expected" <<'PY'
import importlib.metadata
import pathlib
import sys

import ferry

expected = sys.argv[1]
assert ferry.__version__ == expected, f"ferry.__version__ {ferry.__version__!r}, CMake {expected!r}"
metadata = importlib.metadata.version("ferry")
assert metadata == expected, f"importlib.metadata.version('ferry') {metadata!r}, CMake {expected!r}"
package = pathlib.Path(ferry.__file__).resolve().parent
assert package.is_relative_to(pathlib.Path(sys.prefix).resolve()), f"ferry imported from {package}"
assert (package / "py.typed").is_file(), "py.typed missing from the installed package"
assert ferry.tensor_bytes(ferry.DType.BF16, [3, 5]) == 30
PY
echo "pip install check: ferry $expected installs into a venv and imports"

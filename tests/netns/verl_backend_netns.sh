#!/usr/bin/env bash
# The verl checkpoint-engine backend (ferry.verl.checkpoint_engine) disaggregated: verl's
# manager sequence replayed by tests/netns/verl_backend_netns.py over rank processes in
# three network namespaces (three_nodes.sh), so the rollout nodes reach the actor only
# over the network (abstract sockets, hence shm, do not cross namespaces):
#
#   ns s: actor, master rank, 10.77.0.1 --veth-- ns a: node-b, rollout ranks 0, 1 (relay in 0)
#                                       --veth-- ns b: node-c, rollout ranks 2, 3 (relay in 2)
#
# Exit 77 (skip) without root or netns; everything is torn down on exit, pass or fail.
# verl_stack_netns.sh (ctest netns.verl_stack) runs the same shape under verl's own
# CheckpointEngineManager and worker classes over a Ray cluster spanning the namespaces.
#
#   sudo bash tests/netns/verl_backend_netns.sh build/python [python3]
set -uo pipefail

PACKAGE=$(readlink -f "${1:?usage: verl_backend_netns.sh path/to/build/python [python]}")
PYTHON=${2:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TAG="fv$$"                       # unique names: parallel runs must not collide
source "$HERE/three_nodes.sh"
if ! PYTHONPATH="$PACKAGE" "$PYTHON" -c "import ferry, torch" 2>/dev/null; then
  echo "SKIP: $PYTHON cannot import ferry (from $PACKAGE) and torch"; exit 77
fi
PYTHONPATH="$PACKAGE:$HERE/../python" PYTHONDONTWRITEBYTECODE=1 \
  "$PYTHON" "$HERE/verl_backend_netns.py" "$NS_S" "$NS_A" "$NS_B" "$WORK"

#!/usr/bin/env bash
# ferry.dcp across network namespaces: two "nodes" (namespaces a and b of three_nodes.sh), each
# with its ranks' own checkpoint folder, so that a load's fetch of the shard files a node lacks
# crosses the namespaces' bridge, not loopback:
#
#   ns s: the driver and each job's rendezvous store   10.77.0.1 --veth-- ns a: node0 ranks
#                                                                --veth-- ns b: node1 ranks
#
# dcp_netns.py launches the ranks (tests/dcp/dcp_worker.py, one process each, under
# `ip netns exec`) and says what it checks. Every process of the three namespaces is killed on
# exit, pass or fail. About 2 minutes on 2 cores, one of them spent waiting out the reader's 60 s
# connect timeout (the down node); the driver bounds itself at 240 s. Exit 77 (skip) without
# root, netns, or the Python packages.
#
#   sudo bash tests/netns/dcp_netns.sh build/python [python3]
set -uo pipefail

PACKAGE=$(readlink -f "${1:?usage: dcp_netns.sh path/to/build/python [python]}")
PYTHON=${2:-python3}
# The venv's python as given, made absolute (not resolved: its symlink leads out of the venv).
case "$PYTHON" in */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
TAG="fd$$"                       # unique names: parallel runs must not collide
source "$HERE/three_nodes.sh"
kill_namespaces() {  # the ranks and anything they started: every process in our namespaces
  local ns p
  for ns in "$NS_S" "$NS_A" "$NS_B"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
}
trap 'kill_namespaces; cleanup' EXIT
if ! PYTHONPATH="$PACKAGE" "$PYTHON" -c "import ferry.dcp, torch.distributed" 2>/dev/null; then
  echo "SKIP: $PYTHON cannot import ferry.dcp (from $PACKAGE) and torch.distributed"
  exit 77
fi

export PYTHONPATH="$PACKAGE" PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
unset FERRY_DCP_HOST FERRY_TOKEN FERRY_TOKEN_FILE
start=$(date +%s)
# three_nodes.sh's veths: "<tag>1n" in ns a (10.77.0.2), "<tag>2n" in ns b (10.77.0.3).
# TORCH_CPP_LOG_LEVEL: the store's warnings that it cannot resolve its clients' host names.
TORCH_CPP_LOG_LEVEL=ERROR ip netns exec "$NS_S" timeout -s KILL 270 "$PYTHON" \
  "$HERE/dcp_netns.py" "$NS_A" "${TAG}1n" "$NS_B" "${TAG}2n" "$WORK"
rc=$?
[ $rc -eq 137 ] && echo "FAIL: the driver was killed after 270 s"
echo "   total $(( $(date +%s) - start )) s"
exit $rc

#!/usr/bin/env bash
# The verl checkpoint-engine backend disaggregated under verl's REAL classes and REAL Ray: a
# Ray cluster of three nodes, one per network namespace (three_nodes.sh), joined only over the
# namespaces' bridge (abstract sockets, hence ferry's shm sessions, do not cross namespaces):
#
#   ns s: Ray head, driver, trainer   10.77.0.1 --veth-- ns a: Ray node, rollout ranks 0, 1
#                                               --veth-- ns b: Ray node, rollout ranks 2, 3
#
# verl_stack_netns.py drives the updates through verl's CheckpointEngineManager and says what
# it checks. Ray here is private to the test: its temp dir (RAY_TMPDIR, where `ray start`
# records the cluster that a bare ray.init() on this machine would join) and its token
# (RAY_AUTH_TOKEN_PATH) live in the test's folder, its ports in its namespaces, and every
# process of the three namespaces is killed on exit, pass or fail (never `ray stop`, which
# would stop every Ray on the machine). Exit 77 (skip) without root, netns, or the Python
# packages.
#
#   sudo bash tests/netns/verl_stack_netns.sh build/python [python3]
set -uo pipefail

PACKAGE=$(readlink -f "${1:?usage: verl_stack_netns.sh path/to/build/python [python]}")
PYTHON=${2:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TAG="fr$$"                       # unique names: parallel runs must not collide
source "$HERE/three_nodes.sh"
kill_namespaces() {  # Ray's daemons outlive `ray start`: end every process in our namespaces
  local ns p
  for ns in "$NS_S" "$NS_A" "$NS_B"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
}
trap 'kill_namespaces; cleanup' EXIT
if ! PYTHONPATH="$PACKAGE" "$PYTHON" -c "import ferry, torch, ray, verl, transformers" 2>/dev/null; then
  echo "SKIP: $PYTHON cannot import ferry (from $PACKAGE), torch, ray, verl and transformers"
  exit 77
fi

# Inherited by every Ray daemon and worker: `ray start` passes its environment on.
export PYTHONPATH="$PACKAGE:$HERE" PYTHONDONTWRITEBYTECODE=1
export RAY_TMPDIR="$WORK" RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$WORK/ray_token"
export RAY_USAGE_STATS_ENABLED=0 RAY_enable_worker_prestart=0 RAY_prestart_worker_first_driver=0
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VERL_LOGGING_LEVEL=ERROR TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1
(umask 077; "$PYTHON" -c "import secrets; print(secrets.token_hex(32), end='')" >"$WORK/ray_token")

# One after the other: nodes started at once race for the numbered socket names of the
# session folder they share (one timed out at startup).
ray_start() {  # ray_start <ns> <node ip> <custom resource> <cpus> [ray start args...]
  local ns=$1 ip=$2 resource=$3 cpus=$4; shift 4
  ip netns exec "$ns" "$PYTHON" -c \
    'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; sys.exit(main())' \
    start --node-ip-address="$ip" --num-cpus="$cpus" --resources="{\"$resource\": $cpus}" \
    --object-store-memory=$((128 << 20)) --disable-usage-stats "$@" >"$WORK/ray-$resource.log" 2>&1 \
    || { echo "FAIL: ray start in $ns ($resource) exited $?:"; tail -5 "$WORK/ray-$resource.log"; return 1; }
}
start=$(date +%s)
ray_start "$NS_S" 10.77.0.1 ns_actor 1 --head --port=6379 --include-dashboard=false || exit 1
ray_start "$NS_A" 10.77.0.2 ns_node_b 3 --address=10.77.0.1:6379 || exit 1  # 2 ranks, 1 spare
ray_start "$NS_B" 10.77.0.3 ns_node_c 2 --address=10.77.0.1:6379 || exit 1
echo "   Ray: head and 2 nodes started in 3 namespaces in $(( $(date +%s) - start )) s"

ip netns exec "$NS_S" timeout -s KILL 300 "$PYTHON" "$HERE/verl_stack_netns.py" \
  "$NS_S" "$NS_A" "$NS_B" "$WORK"
rc=$?
if [ $rc -ne 0 ]; then  # where Ray's side of a failure shows
  for f in "$WORK"/ray/session_latest/logs/raylet*.out; do
    [ -f "$f" ] && grep -hE " (E|F) " "$f" | tail -3
  done
  [ $rc -eq 137 ] && echo "FAIL: the driver was killed after 300 s"
fi
echo "   total $(( $(date +%s) - start )) s"
exit $rc

# Sourced by tests/netns/sync_netns_test.sh and bench/sync_net_bench.sh: three network
# namespaces as three "nodes", torn down on exit, pass or fail.
#
#   ns $NS_S: 10.77.0.1 on a bridge --veth-- ns $NS_A: 10.77.0.2
#                                   --veth-- ns $NS_B: 10.77.0.3
#
# Needs TAG (unique prefix: parallel runs must not collide). Sets NS_S, NS_A, NS_B, WORK (a
# temp folder), PIDS (background pids killed on exit; append yours) and SENDER_IP. Exits 77
# (skip) without root or network namespaces, 1 when the setup fails.
NS_S="$TAG-s" NS_A="$TAG-a" NS_B="$TAG-b"
WORK=$(mktemp -d)
PIDS=()
SENDER_IP=10.77.0.1

cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  for ns in "$NS_S" "$NS_A" "$NS_B"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for network namespaces"; exit 77; fi
if ! ip netns add "$NS_S" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
ip netns add "$NS_A" && ip netns add "$NS_B" || exit 1

# One subnet, as nodes of a cluster share one: a bridge in the sender's namespace and a
# veth pair to each other namespace. (With one subnet per pair the sender's UCX worker
# advertises addresses a node cannot reach, and that node's connection attempts fail.)
ip -n "$NS_S" link add "${TAG}br" type bridge || { echo "FAIL: bridge setup"; exit 1; }
ip -n "$NS_S" addr add 10.77.0.1/24 dev "${TAG}br" && ip -n "$NS_S" link set "${TAG}br" up
join() {  # join <ns> <n> : veth "<tag><n>s" on the bridge, "<tag><n>n" in <ns> as 10.77.0.<n+1>
  local ns=$1 n=$2
  ip link add "$TAG${n}s" type veth peer name "$TAG${n}n" || return 1
  ip link set "$TAG${n}s" netns "$NS_S" && ip link set "$TAG${n}n" netns "$ns" || return 1
  ip -n "$NS_S" link set "$TAG${n}s" master "${TAG}br" && ip -n "$NS_S" link set "$TAG${n}s" up
  ip -n "$ns" addr add "10.77.0.$((n + 1))/24" dev "$TAG${n}n" && ip -n "$ns" link set "$TAG${n}n" up
}
for ns in "$NS_S" "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
join "$NS_A" 1 && join "$NS_B" 2 || { echo "FAIL: veth setup"; exit 1; }

# Sourced by tests/netns/relay_chain_netns_test.sh and bench/sync_net_bench.sh: a sender's
# network namespace and NODE_COUNT receiving "nodes", each its own namespace, torn down on
# exit, pass or fail (three_nodes.sh is the fixed two-node form of the same).
#
#   ns $NS_S: 10.77.0.1 on a bridge --veth-- ns ${NS_NODE[1]}: 10.77.0.2
#                                   --veth-- ns ${NS_NODE[2]}: 10.77.0.3   ...
#
# Needs TAG (unique prefix: parallel runs must not collide) and NODE_COUNT (1..8). Sets NS_S,
# NS_NODE[1..NODE_COUNT], node_ip N, WORK (a temp folder), PIDS (background pids killed on
# exit; append yours), SENDER_IP and sender_tx_bytes (bytes the sender's node has sent on its
# link, from the kernel's counter). Exits 77 (skip) without root or network namespaces, 1 when
# the setup fails.
NS_S="$TAG-s"
NS_NODE=()
for n in $(seq 1 "$NODE_COUNT"); do NS_NODE[$n]="$TAG-$n"; done
WORK=$(mktemp -d)
PIDS=()
SENDER_IP=10.77.0.1

node_ip() { echo "10.77.0.$(($1 + 1))"; }

cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  ip netns del "$NS_S" 2>/dev/null
  for ns in "${NS_NODE[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for network namespaces"; exit 77; fi
if ! ip netns add "$NS_S" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
for ns in "${NS_NODE[@]}"; do ip netns add "$ns" || exit 1; done

# One subnet, as nodes of a cluster share one (three_nodes.sh says why): a bridge in the
# sender's namespace and a veth pair to each node. Traffic between two nodes crosses the
# bridge but not the sender's own link, whose counter is the bridge device's.
ip -n "$NS_S" link add "${TAG}br" type bridge || { echo "FAIL: bridge setup"; exit 1; }
ip -n "$NS_S" addr add 10.77.0.1/24 dev "${TAG}br" && ip -n "$NS_S" link set "${TAG}br" up
join_node() {  # join_node <n>: veth "<tag><n>s" on the bridge, "<tag><n>n" in node n
  local n=$1 ns=${NS_NODE[$1]}
  ip link add "$TAG${n}s" type veth peer name "$TAG${n}n" || return 1
  ip link set "$TAG${n}s" netns "$NS_S" && ip link set "$TAG${n}n" netns "$ns" || return 1
  ip -n "$NS_S" link set "$TAG${n}s" master "${TAG}br" && ip -n "$NS_S" link set "$TAG${n}s" up
  ip -n "$ns" addr add "$(node_ip "$n")/24" dev "$TAG${n}n" && ip -n "$ns" link set "$TAG${n}n" up
}
ip -n "$NS_S" link set lo up
for n in $(seq 1 "$NODE_COUNT"); do
  ip -n "${NS_NODE[$n]}" link set lo up
  join_node "$n" || { echo "FAIL: veth setup"; exit 1; }
done

# Bytes the sender's node sent into the bridge so far (the kernel's count, headers included).
sender_tx_bytes() {
  ip netns exec "$NS_S" cat "/sys/class/net/${TAG}br/statistics/tx_bytes"
}

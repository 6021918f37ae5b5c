#!/usr/bin/env bash
# Weight sync across "nodes" in network namespaces: `ferry bench sync --net` with its two
# ends apart, against ucx_perftest on the same veth path. Needs root (exit 77 otherwise).
#
#   ns s: sender 10.77.0.1 (bridge) --veth-- ns a: 10.77.0.2 relay 1 + local receiver(s)
#                                   --veth-- ns b: 10.77.0.3 relay 2 + local receiver(s)
#
# Per bucket size:  U = ucx_perftest -t tag_bw -e at the bucket size, server in ns a, client
# in ns s (the better of -E poll and -E sleep), then a full round of the model with 1 node
# (ns a) and with 2 nodes (ns a and b). Prints GB/s per node, the ratio to U, the 2-node /
# 1-node round-time ratio and each relay's session setup time (Relay::connect).
#
#   sudo bash bench/sync_net_bench.sh build/src/cli/ferry [--bucket-mb 64,512] [--rounds 2]
#        [--receivers-per-node 1] [--preset qwen2.5-0.5b] [--nodes 1,2] (nodes past 2 share ns b)
#        [--save-json DIR]: each case's sender line as DIR/sender_<mb>mb_<nodes>node.json, with
#        U as perftest_gbps and node 1's CPU per round as node_cpu_s_per_round (`ferry plan
#        calibrate --net-from` takes a one-node one)
#        [--rate-mbit R]: every veth shaped to R Mbit/s each way (tc tbf), so the link, not
#        this machine's CPU, bounds the round
# UCX_TLS / UCX_NET_DEVICES, when set, apply to every process alike.
set -uo pipefail

FERRY=${1:?usage: sync_net_bench.sh path/to/ferry [--bucket-mb 64,512] [--rounds 2]}
FERRY=$(readlink -f "$FERRY")
shift
BUCKETS=64,512 ROUNDS=2 PER_NODE=1 PRESET=qwen2.5-0.5b NODES=1,2 SAVE_DIR="" RATE_MBIT=0
while [ $# -gt 0 ]; do
  case $1 in
    --bucket-mb) BUCKETS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --receivers-per-node) PER_NODE=$2; shift 2 ;;
    --preset) PRESET=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --save-json) SAVE_DIR=$2; shift 2 ;;
    --rate-mbit) RATE_MBIT=$2; shift 2 ;;
    *) echo "unknown option $1 (--bucket-mb, --rounds, --receivers-per-node, --preset, --nodes, --save-json, --rate-mbit)" >&2; exit 2 ;;
  esac
done

TAG="fb$$"
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (Debian: ucx-utils)"; exit 1; }
source "$(dirname "$0")/../tests/netns/three_nodes.sh"
# shape <ns> <dev>: the device's egress at RATE_MBIT (both ends of each veth: each direction),
# as tests/netns/plan_netns_validate.sh does: tbf's bucket holds a few GSO packets, its queue
# 20 ms at the rate.
shape() {
  [ "$RATE_MBIT" != 0 ] || return 0
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${RATE_MBIT}mbit" burst 256kb \
    latency 20ms || { echo "FAIL: tc tbf on $2"; exit 1; }
}
shape "$NS_S" "${TAG}1s" && shape "$NS_S" "${TAG}2s" && shape "$NS_A" "${TAG}1n" && shape "$NS_B" "${TAG}2n"
export FERRY_TOKEN=${FERRY_TOKEN:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}

num() { grep -o "\"$2\":[-0-9.e+]*" "$1" | head -1 | cut -d: -f2; }

# U: ucx_perftest tag_bw, server in ns a (10.77.0.2), client in ns s; GB/s (10^9 B/s).
perftest() {  # perftest <bytes> <messages> <mode> <port>
  local bytes=$1 n=$2 mode=$3 port=$4 out
  ip netns exec "$NS_A" ucx_perftest -p "$port" -e -E "$mode" >/dev/null 2>&1 &
  local server=$!
  PIDS+=($server)
  sleep 0.5
  out=$(timeout 120 ip netns exec "$NS_S" ucx_perftest 10.77.0.2 -p "$port" -e -E "$mode" \
    -t tag_bw -s "$bytes" -n "$n" -w 2 2>&1)
  kill -9 $server 2>/dev/null; wait $server 2>/dev/null
  echo "$out" | awk '/^Final:/ { printf "%.3f\n", $7 * 1048576 / 1e9; found = 1 } END { if (!found) print "-1" }'
}

# One case: the bench sender in ns s, nodes in ns a (and b). Sets SECONDS_OUT, GBPS, SETUP.
run_case() {  # run_case <bucket_mb> <nodes>
  local mb=$1 nodes=$2 addr="" i ns
  rm -f "$WORK"/*.out "$WORK"/*.err
  ip netns exec "$NS_S" "$FERRY" bench sync --net --listen "$SENDER_IP:0" --nodes "$nodes" \
    --bucket-mb "$mb" --rounds "$ROUNDS" --preset "$PRESET" --json \
    >"$WORK/sender.out" 2>"$WORK/sender.err" &
  local sender=$!
  PIDS+=($sender)
  for _ in $(seq 1 150); do
    # The bench's own line, not the transport's "net: listening on ..." log line.
    addr=$(grep -o "bench sender listening on [0-9.:]*" "$WORK/sender.err" 2>/dev/null |
      head -1 | awk '{print $NF}')
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { echo "bench sender did not start: $(tail -2 "$WORK/sender.err")"; return 1; }
  local node_pids=()
  for i in $(seq 1 "$nodes"); do
    if [ "$i" -eq 1 ]; then ns=$NS_A; else ns=$NS_B; fi
    ip netns exec "$ns" "$FERRY" bench sync --net --connect "$addr" --id "$i" --nodes "$nodes" \
      --bucket-mb "$mb" --rounds "$ROUNDS" --preset "$PRESET" \
      --receivers-per-node "$PER_NODE" --json >"$WORK/node$i.out" 2>"$WORK/node$i.err" &
    node_pids+=($!)
    PIDS+=($!)
  done
  local rc=0
  wait $sender || rc=1
  for p in "${node_pids[@]}"; do wait "$p" || rc=1; done
  if [ $rc -ne 0 ]; then
    for f in "$WORK"/*.err; do echo "--- $(basename "$f")"; tail -3 "$f"; done
    return 1
  fi
  SECONDS_OUT=$(num "$WORK/sender.out" seconds)
  GBPS=$(num "$WORK/sender.out" gbps_per_node)
  SETUP=$(for i in $(seq 1 "$nodes"); do num "$WORK/node$i.out" setup_ms; done | sort -g | tail -1)
}

echo "sync_net_bench: $PRESET bf16, sender ns s (10.77.0.1) -> relays in ns a/b -> $PER_NODE local receiver(s) each; UCX_TLS=${UCX_TLS:-(unset)}; links: ${RATE_MBIT} Mbit/s (0: unshaped); median of $ROUNDS rounds after a warm-up"
printf "%-9s %-5s %-8s %-9s %-8s %-6s %-7s %-9s %s\n" bucket_mb nodes seconds GB/s/node U_GB/s U_mode ratio_U "t(N)/t(1)" setup_ms_max
PORT=20000
FAILED=0
for mb in ${BUCKETS//,/ }; do
  bytes=$((mb << 20))
  messages=$(( (1000000000 + bytes - 1) / bytes )); [ $messages -lt 4 ] && messages=4
  U=-1 UMODE=-
  for mode in poll sleep; do
    PORT=$((PORT + 1))
    u=$(perftest "$bytes" "$messages" "$mode" "$PORT")
    if awk "BEGIN { exit !($u > $U) }"; then U=$u UMODE=$mode; fi
  done
  T1=""
  for nodes in ${NODES//,/ }; do
    if ! run_case "$mb" "$nodes"; then echo "case $mb MiB x $nodes node(s) failed"; FAILED=1; continue; fi
    [ "$nodes" -eq 1 ] && T1=$SECONDS_OUT
    if [ -n "$SAVE_DIR" ]; then  # the sender's line with U and node 1's CPU filled in
      mkdir -p "$SAVE_DIR"
      sed -e "s/\"perftest_gbps\":[-0-9.e+]*/\"perftest_gbps\":$U/" \
        -e "s/\"node_cpu_s_per_round\":[-0-9.e+]*/\"node_cpu_s_per_round\":$(num "$WORK/node1.out" cpu_s_per_round)/" \
        "$WORK/sender.out" >"$SAVE_DIR/sender_${mb}mb_${nodes}node.json"
    fi
    ratio_u=$(awk "BEGIN { if ($U > 0) printf \"%.2f\", $GBPS / $U; else print \"-\" }")
    tr=$(awk "BEGIN { if (\"$T1\" != \"\") printf \"%.2f\", $SECONDS_OUT / ${T1:-1}; else print \"-\" }")
    printf "%-9s %-5s %-8.4f %-9.3f %-8s %-6s %-7s %-9s %.1f\n" "$mb" "$nodes" "$SECONDS_OUT" "$GBPS" "$U" "$UMODE" "$ratio_u" "$tr" "$SETUP"
  done
done
echo "targets: ratio_U >= 0.85 (1 node), t(2)/t(1) < 1.3, setup < 50 ms"
exit $FAILED

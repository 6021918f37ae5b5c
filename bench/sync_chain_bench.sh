#!/usr/bin/env bash
# Many nodes through relays: a star (the sender feeds every node's relay) against a chain
# (the sender feeds node 1's relay, which feeds node 2's, ...; `ferry sync topology`), for
# 1, 2 and 4 "nodes" in network namespaces, through the CLI. Needs root (exit 77 otherwise).
#
#   ns s: sender 10.77.0.1 (bridge) --veth-- node n (10.77.0.n+1): relay + 1 local receiver
#
# Per case: the median round time of the rounds after the first, the bytes the sender's node
# sent on its link per round (the kernel's tx counter of its bridge, headers and handshakes
# included, over all rounds) against the model's bytes, and the CPU seconds every process
# used per round (all "nodes" share this machine's cores: nproc says how many), and
# core_share = cpu_s / (cores x round_s): near 1, the round waits for CPU, not the links
# (cpu_s also holds the sender's synthetic fill between rounds, so it is an upper bound).
#
#   sudo bash bench/sync_chain_bench.sh build/src/cli/ferry [--nodes 1,2,4] [--rounds 4]
#        [--preset qwen2.5-0.5b] [--layers 0] [--bucket-mb 64]
set -uo pipefail

FERRY=${1:?usage: sync_chain_bench.sh path/to/ferry [--nodes 1,2,4] [--rounds 4]}
FERRY=$(readlink -f "$FERRY")
shift
NODES=1,2,4 ROUNDS=4 PRESET=qwen2.5-0.5b LAYERS=0 BUCKET=64
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) NODES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --preset) PRESET=$2; shift 2 ;;
    --layers) LAYERS=$2; shift 2 ;;
    --bucket-mb) BUCKET=$2; shift 2 ;;
    *) echo "unknown option $1 (--nodes, --rounds, --preset, --layers, --bucket-mb)" >&2; exit 2 ;;
  esac
done
[ "$ROUNDS" -ge 2 ] || { echo "--rounds: give 2 or more (the first is a warm-up)" >&2; exit 2; }

TAG="fk$$"
NODE_COUNT=$(echo "${NODES//,/ }" | tr ' ' '\n' | sort -n | tail -1)
source "$(dirname "$0")/../tests/netns/nodes.sh"
export FERRY_TOKEN=${FERRY_TOKEN:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
PORT=21000

in_ns() { local ns=$1; shift; exec ip netns exec "$ns" "$@"; }
# CPU seconds of every finished child so far, into CPU (bash `times`, second line; run in
# this shell, not a $(...) subshell, whose children are not these).
children_cpu() {
  times >"$WORK/times"
  CPU=$(tail -1 "$WORK/times" | awk '{ gsub(/[ms]/, " "); print $1 * 60 + $2 + $3 * 60 + $4 }')
}

# run_case <shape> <nodes>: sets ROUND_S (median), LINK_BYTES (per round), MODEL_BYTES, CPU_S.
run_case() {
  local shape=$1 nodes=$2 i up down upstream serve pids=() receivers=1
  [ "$shape" = star ] && receivers=$nodes
  rm -f "$WORK"/*.out "$WORK"/*.err
  PORT=$((PORT + 10))
  local cpu0 tx0
  children_cpu
  cpu0=$CPU
  tx0=$(sender_tx_bytes)
  (in_ns "$NS_S" "$FERRY" sync serve --listen "0.0.0.0:$PORT" --receivers "$receivers" \
    --rounds "$ROUNDS" --preset "$PRESET" --layers "$LAYERS" --bucket-mb "$BUCKET" --timeout 120 \
    --json >"$WORK/sender.out" 2>"$WORK/sender.err") &
  local sender=$!
  PIDS+=($sender)
  while read -r _ i _ up _ down _; do
    if [ "$shape" = star ]; then upstream="$SENDER_IP:$PORT"; down=0
    elif [ "$up" = sender ]; then upstream="$SENDER_IP:$PORT"
    else upstream="$(node_ip $((up + 1))):$((PORT + up + 1))"; fi
    serve=()
    [ "$down" -gt 0 ] && serve=(--serve-relays "$(node_ip $((i + 1))):$((PORT + i + 1))" --downstream "$down")
    (in_ns "${NS_NODE[$((i + 1))]}" "$FERRY" sync relay --connect "$upstream" --id "$i" \
      --local "@$TAG-r$i" --receivers 1 "${serve[@]}" --rounds "$ROUNDS" --timeout 120 --json \
      >"$WORK/relay$i.out" 2>"$WORK/relay$i.err") &
    pids+=($!)
    (in_ns "${NS_NODE[$((i + 1))]}" "$FERRY" sync recv --address "@$TAG-r$i" --id 0 \
      --rounds "$ROUNDS" --timeout 120 --json >"$WORK/recv$i.out" 2>"$WORK/recv$i.err") &
    pids+=($!)
  done < <("$FERRY" sync topology --nodes "$nodes" --shape chain)
  PIDS+=("${pids[@]}")
  local rc=0
  wait $sender || rc=1
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  if [ $rc -ne 0 ]; then
    for f in "$WORK"/*.err; do echo "--- $(basename "$f")"; tail -3 "$f"; done
    return 1
  fi
  LINK_BYTES=$(( ($(sender_tx_bytes) - tx0) / ROUNDS ))
  children_cpu
  CPU_S=$(awk "BEGIN { printf \"%.2f\", ($CPU - $cpu0) / $ROUNDS }")
  MODEL_BYTES=$(grep -o '"bytes":[0-9]*' "$WORK/sender.out" | head -1 | cut -d: -f2)
  ROUND_S=$(grep -o '"seconds":[0-9.e+-]*' "$WORK/sender.out" | tail -n +2 | cut -d: -f2 |
    sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
}

echo "sync_chain_bench: $PRESET (layers ${LAYERS/#0/all}) bf16, bucket $BUCKET MiB, $ROUNDS rounds (median of all but the first); $(nproc) cores; load: $(uptime | sed 's/.*load average: //')"
printf "%-6s %-5s %-9s %-9s %-14s %-12s %-10s %s\n" shape nodes round_s "t(N)/t(1)" link_bytes/round x_model cpu_s/round core_share
FAILED=0
for shape in star chain; do
  T1=""
  for nodes in ${NODES//,/ }; do
    if [ "$shape" = chain ] && [ "$nodes" -eq 1 ] && [ -n "${ONE_NODE:-}" ]; then
      read -r ROUND_S LINK_BYTES MODEL_BYTES CPU_S <<<"$ONE_NODE"  # one node: star = chain
    elif ! run_case "$shape" "$nodes"; then echo "case $shape x $nodes failed"; FAILED=1; continue; fi
    [ "$nodes" -eq 1 ] && T1=$ROUND_S && ONE_NODE="$ROUND_S $LINK_BYTES $MODEL_BYTES $CPU_S"
    printf "%-6s %-5s %-9.3f %-9s %-14s %-12.3f %-10s %.2f\n" "$shape" "$nodes" "$ROUND_S" \
      "$(awk "BEGIN { t1 = \"$T1\"; if (t1 != \"\") printf \"%.2f\", $ROUND_S / t1; else print \"-\" }")" \
      "$LINK_BYTES" "$(awk "BEGIN { print $LINK_BYTES / $MODEL_BYTES }")" "$CPU_S" \
      "$(awk "BEGIN { print $CPU_S / ($(nproc) * $ROUND_S) }")"
  done
done
echo "targets (chain): link bytes = 1.0x model bytes at every node count; t(4)/t(1) <= 1.5"
echo "load after: $(uptime | sed 's/.*load average: //')"
exit $FAILED

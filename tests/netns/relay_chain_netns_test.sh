#!/usr/bin/env bash
# Relays that feed relays, across four "nodes" (network namespaces), through the CLI:
#
#   ns s: sender 10.77.0.1 -> node 1 (10.77.0.2) relay 0 -> node 2 relay 1 -> node 3 relay 2
#
# each relay with one local receiver; `ferry sync topology` says which relay feeds which.
# Checks: a chain of 3 relays gets several rounds bit-exact while the sender's link carries
# each byte about once (its kernel counter); the middle relay killed mid-round is named by the
# sender (through relay 0) and by the relay behind it, and the next session, re-formed
# without it, reaches the last node; the tree form (fan-out 2) bit-exact.
# Exit 77 (skip) without root or netns.
#
#   sudo [CASES="1 3"] bash tests/netns/relay_chain_netns_test.sh build/src/cli/ferry
set -uo pipefail

FERRY=${1:?usage: relay_chain_netns_test.sh path/to/ferry}
FERRY=$(readlink -f "$FERRY")
TAG="fc$$" NODE_COUNT=3
PORT=5600  # each case listens on fresh ports: a killed process's port may linger
FAILURES=0
CASE_FAILURES=0
source "$(dirname "$0")/nodes.sh"
export FERRY_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
PRESET=(--preset qwen2.5-0.5b --layers 4 --bucket-mb 64)

in_ns() { local ns=$1; shift; exec ip netns exec "$ns" "$@"; }
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); CASE_FAILURES=$((CASE_FAILURES + 1)); }
pass() {
  if [ $CASE_FAILURES -eq 0 ]; then echo "ok: $*"; else
    for f in "$WORK"/*.err; do echo "   --- $(basename "$f")"; tail -3 "$f" | sed 's/^/   /'; done
  fi
  CASE_FAILURES=0
  rm -f "$WORK"/*.out "$WORK"/*.err
}
wait_for() {  # wait_for <pid> <seconds>: its exit status, or 124 after killing it
  local pid=$1 limit=$2 t=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.2; t=$((t + 1))
    if [ $t -ge $((limit * 5)) ]; then kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; return 124; fi
  done
  wait "$pid"
}
hashes() { grep -o '"content_hash":"[0-9a-f]*"' "$1" | cut -d'"' -f4 | tr '\n' ' '; }
CASES=" ${CASES:-1 2 3} "
want() { case $CASES in *" $1 "*) return 0 ;; esac; return 1; }
stop_all() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=(); }

start_sender() {  # start_sender <name> <args...>
  local name=$1; shift
  PORT=$((PORT + 10))
  (in_ns "$NS_S" "$FERRY" sync serve --listen "0.0.0.0:$PORT" --json "${PRESET[@]}" "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.err") &
  PIDS+=($!)
  SENDER=$!
}
# start_relay <node> <upstream host:port> <downstream count> <rounds> <args...>: relay node-1
# (it serves its relays on <node ip>:PORT+<node>) and one local receiver, pids RELAY<n> RECV<n>.
start_relay() {
  local n=$1 upstream=$2 down=$3 rounds=$4; shift 4
  local ns=${NS_NODE[$n]} serve=()
  [ "$down" -gt 0 ] && serve=(--serve-relays "$(node_ip "$n"):$((PORT + n))" --downstream "$down")
  (in_ns "$ns" "$FERRY" sync relay --connect "$upstream" --id "$((n - 1))" --local "@$TAG-r$n" \
    --receivers 1 "${serve[@]}" --rounds "$rounds" --json "$@" \
    >>"$WORK/relay$n.out" 2>>"$WORK/relay$n.err") &
  PIDS+=($!)
  eval "RELAY$n=$!"
  (in_ns "$ns" "$FERRY" sync recv --address "@$TAG-r$n" --id 0 --rounds "$rounds" --json "$@" \
    >>"$WORK/recv$n.out" 2>>"$WORK/recv$n.err") &
  PIDS+=($!)
  eval "RECV$n=$!"
}
# start_topology <rounds> <topology args...> <-- <relay args...>: one relay per node, wired as
# `ferry sync topology` says (node i of its output is namespace node i+1).
start_topology() {
  local rounds=$1; shift
  local topo=() line i up down upstream
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do topo+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  while read -r _ i _ up _ down _; do
    if [ "$up" = sender ]; then upstream="$SENDER_IP:$PORT"; else
      upstream="$(node_ip $((up + 1))):$((PORT + up + 1))"
    fi
    start_relay $((i + 1)) "$upstream" "$down" "$rounds" "$@"
  done < <("$FERRY" sync topology --nodes "$NODE_COUNT" "${topo[@]}")
}
check_bit_exact() {  # check_bit_exact <sender name> <rounds>
  local want got f
  want=$(hashes "$WORK/$1.out")
  [ "$(echo $want | wc -w)" -eq "$2" ] || fail "sender printed $(echo $want | wc -w) rounds, not $2"
  for f in "$WORK"/recv*.out; do
    got=$(hashes "$f")
    [ "$got" = "$want" ] || fail "$(basename "$f"): content hashes '$got', sender sent '$want'"
  done
}
# The sender's link carries each byte about once: its kernel tx count over the rounds' tensor
# bytes (a star of 3 relays would be 3.0).
check_link_bytes() {  # check_link_bytes <sender name> <tx bytes before>
  local tx=$(( $(sender_tx_bytes) - $2 ))
  local bytes=$(grep -o '"bytes":[0-9]*' "$WORK/$1.out" | cut -d: -f2 | paste -sd+ | bc)
  LINK_RATIO=$(awk "BEGIN { printf \"%.3f\", $tx / $bytes }")
  awk "BEGIN { exit !($LINK_RATIO < 1.2) }" ||
    fail "the sender's link carried $tx bytes for $bytes tensor bytes ($LINK_RATIO x)"
}

# 1. A chain of 3 relays, 3 rounds bit-exact, each byte once on the sender's link.
if want 1; then
tx0=$(sender_tx_bytes)
start_sender chain --receivers 1 --rounds 3 --timeout 30
start_topology 3 --shape chain -- --timeout 30
if wait_for "$SENDER" 180; then
  check_bit_exact chain 3
  check_link_bytes chain "$tx0"
else
  fail "sender of the chain exited $?"
fi
for n in 1 2 3; do eval "wait_for \$RECV$n 30" || fail "receiver on node $n exited $?"; done
pass "chain of 3 relays, 3 rounds bit-exact; sender link ${LINK_RATIO:-?} x tensor bytes"
stop_all
fi

# 2. The middle relay killed mid-round: relay 0 and so the sender name it (10.77.0.3); the
#    relay behind it names it as its upstream; a new session without it (node 3 fed by node
#    1) reaches node 3. The sender and node 1 run with --keep-going and re-form.
if want 2; then
start_sender kill --receivers 1 --rounds 6 --timeout 20 --keep-going
start_relay 1 "$SENDER_IP:$PORT" 1 6 --timeout 20 --keep-going
start_relay 2 "$(node_ip 1):$((PORT + 1))" 1 6 --timeout 20
start_relay 3 "$(node_ip 2):$((PORT + 2))" 0 6 --timeout 20
for _ in $(seq 1 600); do grep -q '"round":1' "$WORK/kill.out" 2>/dev/null && break; sleep 0.2; done
sleep 0.2
kill -9 "$RELAY2"
wait "$RELAY2" 2>/dev/null
start=$(date +%s)
wait_for "$RELAY3" 15; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "relay behind the killed one exited $rc (124: hung)"
grep -q "10.77.0.3" "$WORK/relay3.err" || fail "relay 2 does not name its dead upstream 10.77.0.3: $(tail -1 "$WORK/relay3.err")"
for _ in $(seq 1 50); do grep -q "starting a new session" "$WORK/kill.err" && break; sleep 0.2; done
# Relay 0 reports it by id and address, and keeps its link open until the sender has read that.
grep "new session" "$WORK/kill.err" | grep -q "relay 0: round [0-9]*: relay 1 at 10.77.0.3" ||
  fail "sender's error does not name the killed relay 1 (10.77.0.3) through relay 0: $(grep -h 'new session' "$WORK/kill.err" | tail -1)"
wait_for "$RECV3" 10 >/dev/null
rm -f "$WORK/recv3.out"
# Re-formed: node 3 now joins relay 0 on node 1, which rejoined the sender.
# More rounds than remain: it ends when the sender does.
start_relay 3 "$(node_ip 1):$((PORT + 1))" 0 10 --timeout 20
wait_for "$SENDER" 120; rc=$?
[ $rc -eq 0 ] || fail "sender with --keep-going exited $rc"
last=$(hashes "$WORK/kill.out" | awk '{print $NF}')
case " $(hashes "$WORK/recv3.out") " in *" $last "*) ;; *) fail "node 3 after the re-form lacks the last round $last";; esac
pass "middle relay killed: named upstream and downstream (${took}s), the chain re-formed without it: $(grep -h 'new session' "$WORK/kill.err" | tail -1 | cut -c1-200)"
stop_all
fi

# 3. The tree form, fan-out 2: node 1 feeds nodes 2 and 3.
if want 3; then
tx0=$(sender_tx_bytes)
start_sender tree --receivers 1 --rounds 2 --timeout 30
start_topology 2 --shape tree --fanout 2 -- --timeout 30
if wait_for "$SENDER" 180; then
  check_bit_exact tree 2
  check_link_bytes tree "$tx0"
else
  fail "sender of the tree exited $?"
fi
pass "tree of fan-out 2, 2 rounds bit-exact; sender link ${LINK_RATIO:-?} x tensor bytes"
stop_all
fi

[ $FAILURES -eq 0 ] && echo "all relay chain netns checks passed" || echo "$FAILURES check(s) failed"
[ $FAILURES -eq 0 ]

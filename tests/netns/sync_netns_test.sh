#!/usr/bin/env bash
# Weight sync across "nodes": three network namespaces joined by veth pairs, a sender in
# one and a relay with two local receivers in each of the others, driven through the CLI.
#
#   ns s: sender 10.77.0.1 (bridge) --veth-- ns a: 10.77.0.2 relay 1 + receivers 0, 1
#                                   --veth-- ns b: 10.77.0.3 relay 2 + receivers 0, 1
#
# Checks: three rounds bit-exact (every receiver's content hash equals the sender's), a
# relay with the wrong token is refused by both sides, a link cut mid-round and a relay
# killed mid-round are each reported by name within the timeout, and nothing hangs.
# Everything is torn down on exit, pass or fail. Exit 77 (skip) without root or netns.
#
#   sudo bash tests/netns/sync_netns_test.sh build/src/cli/ferry
set -uo pipefail

FERRY=${1:?usage: sync_netns_test.sh path/to/ferry}
FERRY=$(readlink -f "$FERRY")
TAG="fy$$"                       # unique names: parallel runs must not collide
PORT=5555  # each case listens on the next port: a killed sender's port may linger
FAILURES=0
source "$(dirname "$0")/three_nodes.sh"
# Session tokens: the sender's, and another as strong for the wrong-token case.
new_token() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
RIGHT=$(new_token)
WRONG=$(new_token)

# Runs a command in a namespace; in the background ($!) the pid is the command's own
# ("ip netns exec" execs it), so kill -9 $! kills the ferry process, not a subshell.
in_ns() { local ns=$1; shift; exec ip netns exec "$ns" "$@"; }
CASE_FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); CASE_FAILURES=$((CASE_FAILURES + 1)); }
# Ends a case: "ok" when none of its checks failed, else every process's last words.
pass() {
  if [ $CASE_FAILURES -eq 0 ]; then echo "ok: $*"; else
    for f in "$WORK"/*.err; do echo "   --- $(basename "$f")"; tail -3 "$f" | sed 's/^/   /'; done
  fi
  CASE_FAILURES=0
  [ -n "${KEEP:-}" ] && cp -r "$WORK" /tmp/netns-keep; rm -f "$WORK"/*.out "$WORK"/*.err
}

# Starts the sender (background) with the arguments given; $1 names its output files.
start_sender() {
  local name=$1; shift
  PORT=$((PORT + 1))
  (in_ns "$NS_S" env FERRY_TOKEN="$RIGHT" "$FERRY" sync serve --listen "0.0.0.0:$PORT" \
    --json "$@" >"$WORK/$name.out" 2>"$WORK/$name.err") &
  PIDS+=($!)
  SENDER=$!
}
# start_node <ns> <relay-id> <sender-ip> <token> <rounds> <timeout>: relay + 2 receivers
start_node() {
  local ns=$1 id=$2 ip=$3 token=$4 rounds=$5 timeout=$6 extra=${7:-}
  (in_ns "$ns" env FERRY_TOKEN="$token" "$FERRY" sync relay --connect "$ip:$PORT" --id "$id" \
    --local "@$TAG-relay" --receivers 2 --rounds "$rounds" --timeout "$timeout" --json $extra \
    >>"$WORK/relay$id.out" 2>>"$WORK/relay$id.err") &
  PIDS+=($!)
  eval "RELAY$id=$!"
  [ "${RELAY_ONLY:-}" = 1 ] && return
  for r in 0 1; do
    (in_ns "$ns" "$FERRY" sync recv --address "@$TAG-relay" --id "$r" --rounds "$rounds" \
      --timeout "$timeout" --json $extra >"$WORK/recv$id.$r.out" 2>"$WORK/recv$id.$r.err") &
    PIDS+=($!)
    eval "RECV${id}_$r=$!"
  done
}
# Waits for pid $1 at most $2 seconds; returns its exit status, or 124 after killing it.
wait_for() {
  local pid=$1 limit=$2 t=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.2; t=$((t + 1))
    if [ $t -ge $((limit * 5)) ]; then kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; return 124; fi
  done
  wait "$pid"
}
# Waits at most $2 seconds until the sender logging to $1 says it waits for receivers.
wait_listening() {
  local t=0
  until grep -q "waiting for" "$1" 2>/dev/null; do
    sleep 0.2; t=$((t + 1))
    [ $t -lt $(($2 * 5)) ] || return 1
  done
}
hashes() { grep -o '"content_hash":"[0-9a-f]*"' "$1" | cut -d'"' -f4 | tr '\n' ' '; }
stop_all() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=(); }

# 1. Three rounds through two relays, two local receivers each, bit-exact.
start_sender good --receivers 2 --rounds 3 --bucket-mb 64 --preset qwen2.5-0.5b --timeout 30
start_node "$NS_A" 1 $SENDER_IP "$RIGHT" 3 30
start_node "$NS_B" 2 $SENDER_IP "$RIGHT" 3 30
if wait_for "$SENDER" 180; then
  want=$(hashes "$WORK/good.out")
  [ "$(echo $want | wc -w)" -eq 3 ] || fail "sender printed $(echo $want | wc -w) rounds, not 3"
  for f in "$WORK"/recv*.out; do
    got=$(hashes "$f")
    [ "$got" = "$want" ] || fail "$(basename "$f"): content hashes '$got', sender sent '$want'"
  done
  grep -h "joined over" "$WORK/good.err" | sed 's/^/   /'
  echo "   content hashes: $want"
else
  fail "sender of the good run exited $?"
fi
pass "3 rounds to 2 relays x 2 receivers, bit-exact"
stop_all

# 2. A relay with the wrong token: refused by both sides, and no weight byte reaches it.
# The relay starts once the sender listens: under load, building the preset can take longer
# than the relay's connect timeout, and "connection refused" is not the refusal tested here.
start_sender auth --receivers 1 --rounds 1 --preset qwen2.5-0.5b --timeout 10
wait_listening "$WORK/auth.err" 60 || fail "sender of the wrong-token case never listened"
start_node "$NS_A" 1 $SENDER_IP "$WRONG" 1 10
wait_for "$RELAY1" 30; rc=$?
[ $rc -ne 0 ] || fail "relay with a wrong token exited 0"
grep -q "refused our token" "$WORK/relay1.err" || fail "relay did not say it was refused: $(tail -1 "$WORK/relay1.err")"
wait_for "$SENDER" 30
grep -q "failed authentication: wrong token" "$WORK/auth.err" || fail "sender did not log the refusal: $(tail -2 "$WORK/auth.err")"
[ ! -s "$WORK/auth.out" ] || fail "sender reported a round to an unauthenticated relay"
for r in 0 1; do ! grep -q '"round"' "$WORK/recv1.$r.out" || fail "receiver $r behind the refused relay got a round"; done
pass "wrong token refused on both sides"
stop_all

# 3. The link to node A cut mid-round: both ends name the peer and the round, in time.
# A relay between rounds when the link goes learns it from its idle timeout (or, later, from
# TCP keepalive), so the nodes bound that wait too.
start_sender cut --receivers 2 --rounds 20 --bucket-mb 64 --preset qwen2.5-0.5b --timeout 5
start_node "$NS_A" 1 $SENDER_IP "$RIGHT" 20 5 "--idle-timeout 10"
start_node "$NS_B" 2 $SENDER_IP "$RIGHT" 20 5 "--idle-timeout 10"
for _ in $(seq 1 100); do grep -q '"round":1' "$WORK/cut.out" 2>/dev/null && break; sleep 0.2; done
sleep 0.3
ip -n "$NS_A" link set "${TAG}1n" down
start=$(date +%s)
wait_for "$SENDER" 30; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "sender after the cut exited $rc"
grep "error" "$WORK/cut.err" | grep -qE "receiver 1 at 10.77.0.2|10.77.0.2" || fail "sender's error does not name relay 1 (10.77.0.2): $(tail -1 "$WORK/cut.err")"
grep -q "round" "$WORK/cut.err" || fail "sender's error does not name the round"
[ $took -le 15 ] || fail "sender took $took s to report the cut (timeout 5 s)"
wait_for "$RELAY1" 30; rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "relay 1 after the cut exited $rc (124: hung)"
pass "cut link reported in ${took}s: $(grep -h error "$WORK/cut.err" | tail -1 | cut -c1-160)"
stop_all
ip -n "$NS_A" link set "${TAG}1n" up

# 4. Relay 2 killed mid-round: the sender names it at once, not after its timeout.
start_sender kill --receivers 2 --rounds 20 --bucket-mb 64 --preset qwen2.5-0.5b --timeout 30
start_node "$NS_A" 1 $SENDER_IP "$RIGHT" 20 30
start_node "$NS_B" 2 $SENDER_IP "$RIGHT" 20 30
for _ in $(seq 1 100); do grep -q '"round":1' "$WORK/kill.out" 2>/dev/null && break; sleep 0.2; done
sleep 0.3
kill -9 "$RELAY2"
start=$(date +%s)
wait_for "$SENDER" 40; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "sender after the kill exited $rc"
grep "error" "$WORK/kill.err" | grep -qE "receiver 2 at 10.77.0.3|10.77.0.3" || fail "sender's error does not name relay 2 (10.77.0.3): $(tail -1 "$WORK/kill.err")"
[ $took -le 10 ] || fail "sender took $took s to notice a killed relay (timeout 30 s)"
# Its local receivers learn at once (socket EOF) that their relay is gone: each exits with an
# error well before its 30 s timeout. (Wait for the exit: on a loaded machine the sender may
# notice before a receiver has written its error.)
for r in 0 1; do
  eval "pid=\$RECV2_$r"
  wait_for "$pid" 10; rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "receiver 2.$r behind the killed relay exited $rc (124: hung)"
  f="$WORK/recv2.$r.err"
  grep -q "aborted" "$f" || fail "$(basename "$f"): a receiver behind the killed relay did not report it: $(tail -1 "$f")"
done
pass "killed relay reported in ${took}s: $(grep -h error "$WORK/kill.err" | tail -1 | cut -c1-160)"
stop_all

# 5. The same sender goes on after a relay dies: --keep-going on every end; relay 2 is
#    killed in round 2 and started again; the rounds after it reach all four receivers.
start_sender again --receivers 2 --rounds 4 --bucket-mb 64 --preset qwen2.5-0.5b --timeout 20 \
  --keep-going
start_node "$NS_A" 1 $SENDER_IP "$RIGHT" 4 20 --keep-going
start_node "$NS_B" 2 $SENDER_IP "$RIGHT" 4 20 --keep-going
# Round 1 done (up to 120 s on a loaded machine), so the kill lands in round 2 and the
# restarted relay's 2 rounds are rounds 3 and 4.
for _ in $(seq 1 600); do grep -q '"round":1' "$WORK/again.out" 2>/dev/null && break; sleep 0.2; done
sleep 0.3
kill -9 "$RELAY2"
wait "$RELAY2" 2>/dev/null
RELAY_ONLY=1 start_node "$NS_B" 2 $SENDER_IP "$RIGHT" 2 20
wait_for "$SENDER" 120; rc=$?
[ $rc -eq 0 ] || fail "sender with --keep-going exited $rc"
sent=$(hashes "$WORK/again.out")
rounds_sent=$(echo $sent | wc -w)
[ "$rounds_sent" -ge 3 ] || fail "sender completed $rounds_sent of 4 rounds"
last=$(echo $sent | awk '{print $NF}')
for f in "$WORK"/recv*.out; do
  wait_for "${PIDS[-1]}" 30 >/dev/null
  got=$(hashes "$f")
  case " $got " in *" $last "*) ;; *) fail "$(basename "$f") lacks the last round ($last): '$got'";; esac
  for h in $got; do
    case " $sent " in *" $h "*) ;; *) fail "$(basename "$f") got content $h the sender never sent";; esac
  done
done
grep -q "starting a new session" "$WORK/again.err" || fail "sender did not start a new session"
pass "after relay 2 died the same sender went on: $rounds_sent of 4 rounds completed, the last to all 4 receivers"
stop_all

[ $FAILURES -eq 0 ] && echo "all netns sync checks passed" || echo "$FAILURES check(s) failed"
[ $FAILURES -eq 0 ]

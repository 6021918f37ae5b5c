#!/usr/bin/env bash
# `ferry plan` against a measured run: S senders (`ferry sync serve --part K/S`), each on a
# "trainer node" of its own, and NODES receiving nodes with a relay per sender and GPUS local
# receivers that take the union of the parts (`ferry sync recv --address` once per relay);
# then the rank-local case: 1 sender, and the GPUS ranks of each node a tensor-parallel group
# of TP, rank r taking only its slice of each tensor (`ferry sync recv --tp r%TP/TP`).
# Every node is a network namespace with one veth "NIC" on a switch namespace's bridge, every
# NIC shaped with tc to RATE_MBIT in each direction, so that the links, not this machine's
# shared cores, bound a round, as the plan assumes of a cluster.
#
#   ns sw: bridge --veth-- ns s1..sS: 10.77.0.1K   (senders, --part K/S)
#                 --veth-- ns 1..NODES: 10.77.0.2N (a relay per sender, GPUS receivers)
#
# For each case it measures, per link, the bytes the kernel counted
# (/sys/class/net/*/statistics, headers included), the bytes, the bytes copied out of the ring
# and the content hash each receiver reports, and the round time (the slowest sender's round,
# from its --json), then asks `ferry plan` for the same shape (`--shard-ways TP` for the
# rank-local case). Checks what a user relies on: every round succeeds; with whole tensors
# every receiver gets the whole model bit-exact (the union's content hash equals one sender's
# whole-model hash), each sender's link carries 1/S of what the senders' links carried
# together (within 1%), and the bytes the plan puts on a sender's link are the measured ones
# (within 2%: headers). Rank-local: each rank gets every tensor of the round and copies out of
# its ring the bytes the plan gives a receiver, model / TP (within 0.2%: the replicated norms
# are the excess), a node's TP ranks together at least the model; the ranks of a node report
# different content hashes, each rank the same on every node, and the sender's link carries
# the plan's bytes (a node still needs every slice: the model once). The predicted / measured
# round time is printed (a table row of docs/plan.md, "Validation"), not asserted: this
# machine's two shared cores decide how close it comes.
#
#   sudo bash tests/netns/plan_netns_validate.sh build/src/cli/ferry
#   SENDERS="1 2" TP=2 NODES=4 GPUS=2 RATE_MBIT=1000 ROUNDS=1 PRESET=qwen2.5-0.5b  (the defaults)
#   TP=1: no rank-local case; SENDERS="": only it. GPUS must be a multiple of TP.
#   RATE_MBIT=0: links not shaped, the plan asked with --shared-host (every node on this
#   machine's cores); CALIBRATION=FILE: `ferry plan --calibration FILE`.
#
# Everything is torn down on exit, pass or fail. Exit 77 (skip) without root or netns or tc.
set -uo pipefail

FERRY=${1:?usage: plan_netns_validate.sh path/to/ferry}
FERRY=$(readlink -f "$FERRY")
SENDERS=${SENDERS-1 2}
TP=${TP:-2}
NODES=${NODES:-4}
GPUS=${GPUS:-2}
RATE_MBIT=${RATE_MBIT:-1000}
ROUNDS=${ROUNDS:-1}
PRESET=${PRESET:-qwen2.5-0.5b}
BUCKET_MB=${BUCKET_MB:-64}
MTU=${MTU:-9000}
TIMEOUT=${TIMEOUT:-60}  # seconds either side waits inside a round
TAG="pv$$"               # unique names: parallel runs must not collide
MAX_S=1
for s in $SENDERS; do [ "$s" -gt "$MAX_S" ] && MAX_S=$s; done
# The cases, senders:shard-ways: each S with whole tensors, then 1 sender to TP-rank groups.
CASES=()
for s in $SENDERS; do CASES+=("$s:1"); done
if [ "$TP" -gt 1 ]; then
  [ $((GPUS % TP)) -eq 0 ] || { echo "FAIL: GPUS=$GPUS is not a multiple of TP=$TP"; exit 1; }
  CASES+=("1:$TP")
fi

NS_SW="$TAG-sw"
NAMESPACES=()
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for network namespaces"; exit 77; fi
if ! command -v tc >/dev/null; then echo "SKIP: needs tc (iproute2) to shape the links"; exit 77; fi
if ! ip netns add "$NS_SW" 2>/dev/null; then echo "SKIP: cannot create network namespaces"; exit 77; fi
NAMESPACES+=("$NS_SW")
ip -n "$NS_SW" link add "${TAG}br" type bridge || { echo "FAIL: bridge setup"; exit 1; }
ip -n "$NS_SW" link set "${TAG}br" mtu "$MTU" up && ip -n "$NS_SW" link set lo up

# shape <ns> <dev>: the device's egress at RATE_MBIT. The bucket holds a few GSO packets
# (veth hands tbf up to 64 KiB at once); the queue holds 20 ms at the rate.
shape() {
  [ "$RATE_MBIT" -gt 0 ] || return 0
  ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${RATE_MBIT}mbit" burst 256kb \
    latency 20ms
}
# node <name> <ip>: namespace $TAG-<name> with veth "<tag><name>n" (its NIC) on the bridge
# (port "<tag><name>w"), both directions shaped.
node() {
  local name=$1 ip=$2 ns="$TAG-$1"
  ip netns add "$ns" || return 1
  NAMESPACES+=("$ns")
  ip link add "$TAG${name}n" type veth peer name "$TAG${name}w" || return 1
  ip link set "$TAG${name}n" netns "$ns" && ip link set "$TAG${name}w" netns "$NS_SW" || return 1
  ip -n "$NS_SW" link set "$TAG${name}w" mtu "$MTU" master "${TAG}br" up || return 1
  ip -n "$ns" link set lo up && ip -n "$ns" link set "$TAG${name}n" mtu "$MTU" up || return 1
  ip -n "$ns" addr add "$ip/24" dev "$TAG${name}n" || return 1
  shape "$ns" "$TAG${name}n" && shape "$NS_SW" "$TAG${name}w"
}
sender_ip() { echo "10.77.0.$((10 + $1))"; }
node_ip() { echo "10.77.0.$((20 + $1))"; }
for k in $(seq 1 "$MAX_S"); do node "s$k" "$(sender_ip "$k")" || { echo "FAIL: setup of sender node $k"; exit 1; }; done
for n in $(seq 1 "$NODES"); do node "$n" "$(node_ip "$n")" || { echo "FAIL: setup of node $n"; exit 1; }; done
# counter <name> <tx|rx>: bytes the node's NIC has sent or received (headers included).
counter() { ip netns exec "$TAG-$1" cat "/sys/class/net/$TAG${1}n/statistics/${2}_bytes"; }

token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export FERRY_TOKEN=$token
in_ns() { local ns=$1; shift; exec ip netns exec "$ns" "$@"; }
wait_for() {  # wait_for <pid> <seconds>: its exit status, or 124 after killing it
  local pid=$1 limit=$2 t=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.2; t=$((t + 1))
    if [ $t -ge $((limit * 5)) ]; then kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; return 124; fi
  done
  wait "$pid"
}
field() { grep -o "\"$2\":[^,}]*" "$1" | cut -d: -f2 | tr -d '"'; }  # field <file> <name>: per round
FAILURES=0
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
WANT_HASHES=""  # the whole model's content hash per round (the 1-sender case's, else the first run's)
ROWS=()
PORT=5600

for CASE in "${CASES[@]}"; do
  S=${CASE%:*} W=${CASE#*:}
  C="S=$S"; [ "$W" -gt 1 ] && C="S=$S, tp $W"  # the case, in messages
  PORT=$((PORT + 1))
  rm -f "$WORK"/*.out "$WORK"/*.err
  # The plan for the same shape: S senders on S nodes of one NIC each (--sender-nodes S).
  # Unshaped links (RATE_MBIT=0): every node on this machine's cores, --shared-host.
  link=(--shared-host)
  [ "$RATE_MBIT" -gt 0 ] && link=(--nic-gbps "$(awk -v r="$RATE_MBIT" 'BEGIN {print r / 1000}')")
  plan=$("$FERRY" plan --preset "$PRESET" --bucket-mb "$BUCKET_MB" --nodes "$NODES" \
    --gpus-per-node "$GPUS" --senders "$S" --sender-nodes "$S" --shard-ways "$W" "${link[@]}" \
    ${CALIBRATION:+--calibration "$CALIBRATION"} --json) || { fail "ferry plan failed"; continue; }
  p_secs=$(echo "$plan" | grep -m1 '"seconds"' | grep -o '[0-9.e+-]*,' | tr -d ,)
  p_bottleneck=$(echo "$plan" | grep -m1 '"bottleneck"' | cut -d'"' -f4)
  # The bytes it puts on a sender node's link (shared host: on all the nodes' streams).
  p_link=$(echo "$plan" | grep -A2 -E '"name": "(sender_link|nodes_on_shared_cpu)"' | grep '"bytes"' | grep -o '[0-9]*')
  p_per_sender=$p_link
  [ "$RATE_MBIT" -gt 0 ] || p_per_sender=$((p_link / S))
  # The bytes it gives one receiver (model / W; a shared host has no receiver_copy stage).
  p_rank=$(echo "$plan" | grep -A2 '"name": "receiver_copy"' | grep '"bytes"' | grep -o '[0-9]*')
  [ -n "$p_rank" ] || p_rank=$(( $(echo "$plan" | grep -m1 '"model_bytes"' | grep -o '[0-9]*') / W ))
  # The run may take twice the prediction and a minute (the whole script stays within
  # ctest's 300 s at the defaults).
  limit=$(awk -v p="$p_secs" -v r="$ROUNDS" 'BEGIN {printf "%d", 2 * p * r + 60}')
  declare -a TX0=() RX0=()
  for k in $(seq 1 "$S"); do TX0[$k]=$(counter "s$k" tx); done
  for n in $(seq 1 "$NODES"); do RX0[$n]=$(counter "$n" rx); done
  SENDER_PIDS=()
  for k in $(seq 1 "$S"); do
    part=(); [ "$S" -gt 1 ] && part=(--part "$k/$S")
    (in_ns "$TAG-s$k" "$FERRY" sync serve --listen "0.0.0.0:$PORT" "${part[@]}" \
      --receivers "$NODES" --rounds "$ROUNDS" --bucket-mb "$BUCKET_MB" --preset "$PRESET" \
      --timeout "$TIMEOUT" --json >"$WORK/sender$k.out" 2>"$WORK/sender$k.err") &
    PIDS+=($!); SENDER_PIDS+=($!)
  done
  for k in $(seq 1 "$S"); do  # building the preset can take a while on a loaded machine
    for _ in $(seq 1 150); do grep -q "waiting for" "$WORK/sender$k.err" 2>/dev/null && break; sleep 0.2; done
  done
  RECV_PIDS=()
  for n in $(seq 1 "$NODES"); do
    addrs=()
    for k in $(seq 1 "$S"); do
      (in_ns "$TAG-$n" "$FERRY" sync relay --connect "$(sender_ip "$k"):$PORT" --id "$n" \
        --local "@$TAG-n$n-p$k" --receivers "$GPUS" --rounds "$ROUNDS" --timeout "$TIMEOUT" \
        --json >"$WORK/relay$n.$k.out" 2>"$WORK/relay$n.$k.err") &
      PIDS+=($!)
      addrs+=(--address "@$TAG-n$n-p$k")
    done
    for r in $(seq 0 $((GPUS - 1))); do
      tp=(); [ "$W" -gt 1 ] && tp=(--tp "$((r % W))/$W")
      (in_ns "$TAG-$n" "$FERRY" sync recv "${addrs[@]}" --id "$r" --preset "$PRESET" "${tp[@]}" \
        --rounds "$ROUNDS" --timeout "$TIMEOUT" --json >"$WORK/recv$n.$r.out" \
        2>"$WORK/recv$n.$r.err") &
      PIDS+=($!); RECV_PIDS+=($!)
    done
  done
  ok=1
  for k in $(seq 1 "$S"); do
    wait_for "${SENDER_PIDS[$((k - 1))]}" "$limit" || { fail "$C: sender $k exited $?: $(tail -1 "$WORK/sender$k.err")"; ok=0; }
  done
  for p in "${RECV_PIDS[@]}"; do wait_for "$p" 30 >/dev/null || { fail "$C: a receiver failed"; ok=0; }; done
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; PIDS=()
  if [ $ok -eq 0 ]; then
    for f in "$WORK"/*.err; do echo "   --- $(basename "$f")"; tail -3 "$f" | sed 's/^/   /'; done
    continue
  fi

  model_bytes=$(field "$WORK/recv1.0.out" bytes | head -1)
  want_tensors=$(field "$WORK/sender1.out" tensors | head -1)
  ring_max=$model_bytes  # the most bytes a rank copied out of its ring in a round
  if [ "$W" -eq 1 ]; then
    # The whole model's hash per round: one sender's, or the union the first run's receivers got.
    if [ "$S" -eq 1 ] || [ -z "$WANT_HASHES" ]; then
      [ "$S" -eq 1 ] && WANT_HASHES=$(field "$WORK/sender1.out" content_hash | tr '\n' ' ')
      [ "$S" -gt 1 ] && WANT_HASHES=$(field "$WORK/recv1.0.out" content_hash | tr '\n' ' ')
    fi
    for f in "$WORK"/recv*.out; do
      got=$(field "$f" content_hash | tr '\n' ' ')
      [ "$got" = "$WANT_HASHES" ] || fail "$C: $(basename "$f" .out): content hashes '$got', the whole model's are '$WANT_HASHES'"
      for b in $(field "$f" bytes); do
        [ "$b" = "$model_bytes" ] || fail "$C: $(basename "$f" .out) read $b bytes in a round, not $model_bytes"
      done
    done
  else
    # Rank-local: rank r of every node holds the same slices (node 1's are the reference), the
    # ranks of a node different ones (and none the whole model), each rank every tensor of
    # every round, and model / W of the bytes: the plan's receiver bytes.
    ring_max=0
    for r in $(seq 0 $((GPUS - 1))); do
      want=$(field "$WORK/recv1.$r.out" content_hash | tr '\n' ' ')
      [ "$(echo $want | wc -w)" -eq "$ROUNDS" ] || fail "$C: rank $r of node 1 reported $(echo $want | wc -w) of $ROUNDS rounds"
      [ -n "$WANT_HASHES" ] && [ "$want" = "$WANT_HASHES" ] && fail "$C: rank $r's content hashes are the whole model's"
      for q in $(seq 0 $((r - 1))); do
        [ $((q % W)) -ne $((r % W)) ] && [ "$want" = "$(field "$WORK/recv1.$q.out" content_hash | tr '\n' ' ')" ] &&
          fail "$C: ranks $q and $r of node 1 (tp $((q % W)) and $((r % W))) report the same content hashes"
      done
      for n in $(seq 1 "$NODES"); do
        f="$WORK/recv$n.$r.out"
        got=$(field "$f" content_hash | tr '\n' ' ')
        [ "$got" = "$want" ] || fail "$C: node $n rank $r: content hashes '$got', node 1 rank $r's are '$want'"
        for t in $(field "$f" tensors); do
          [ "$t" = "$want_tensors" ] || fail "$C: node $n rank $r got $t tensors in a round, the sender sent $want_tensors"
        done
        for b in $(field "$f" bytes); do
          [ "$b" = "$model_bytes" ] || fail "$C: node $n rank $r's round was $b bytes, not $model_bytes"
        done
        for d in $(field "$f" delivered_bytes); do
          [ "$d" -gt "$ring_max" ] && ring_max=$d
          awk -v d="$d" -v p="$p_rank" 'BEGIN {r = d / p; exit !(r > 0.998 && r < 1.002)}' ||
            fail "$C: node $n rank $r copied $d bytes out of its ring, the plan gives a rank $p_rank (model / $W; not within 0.2%)"
        done
      done
    done
    # A node's TP group together holds every element: the slices sum to the model at least.
    for n in $(seq 1 "$NODES"); do
      for g in $(seq 0 $((GPUS / W - 1))); do
        sum=0
        for r in $(seq $((g * W)) $((g * W + W - 1))); do
          sum=$((sum + $(field "$WORK/recv$n.$r.out" delivered_bytes | head -1)))
        done
        [ "$sum" -ge "$model_bytes" ] || fail "$C: node $n's ranks $((g * W))-$((g * W + W - 1)) copied $sum bytes together, less than the model's $model_bytes"
      done
    done
  fi
  # Round time: the slowest sender's, per round; the median over rounds (the lower middle
  # of an even count).
  secs=$(for r in $(seq 1 "$ROUNDS"); do
    for k in $(seq 1 "$S"); do field "$WORK/sender$k.out" seconds | sed -n "${r}p"; done | sort -g | tail -1
  done | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}')
  # Per link: each sender's NIC (tx) and each node's (rx), per round.
  total=0
  declare -a TX=()
  for k in $(seq 1 "$S"); do TX[$k]=$(( ($(counter "s$k" tx) - TX0[$k]) / ROUNDS )); total=$((total + TX[$k])); done
  rx_min=-1 rx_max=0
  for n in $(seq 1 "$NODES"); do
    rx=$(( ($(counter "$n" rx) - RX0[$n]) / ROUNDS ))
    [ $rx_min -lt 0 ] || [ "$rx" -lt $rx_min ] && rx_min=$rx
    [ "$rx" -gt $rx_max ] && rx_max=$rx
  done


  for k in $(seq 1 "$S"); do
    share=$(awk -v a="${TX[$k]}" -v t="$total" 'BEGIN {printf "%.4f", a / t}')
    awk -v s="$share" -v S="$S" 'BEGIN {d = s - 1 / S; exit !(d < 0.01 && d > -0.01)}' ||
      fail "$C: sender $k's link carried $share of the senders' bytes, not 1/$S within 1%"
    awk -v m="${TX[$k]}" -v p="$p_per_sender" 'BEGIN {r = m / p; exit !(r > 0.98 && r < 1.02)}' ||
      fail "$C: sender $k's link carried ${TX[$k]} bytes a round, the plan says $p_per_sender (not within 2%)"
  done
  GB() { awk -v b="$1" 'BEGIN {printf "%.3f", b / 1e9}'; }
  tx_list=$(for k in $(seq 1 "$S"); do printf "%s " "$(GB "${TX[$k]}")"; done)
  ratio=$(awk -v p="$p_secs" -v m="$secs" 'BEGIN {printf "%.2f", p / m}')
  take=whole; [ "$W" -gt 1 ] && take="\`--tp r/$W\`"
  echo "$C: sender links carried ${tx_list}GB a round (plan: $(GB $p_per_sender) each), nodes received $(GB $rx_min)-$(GB $rx_max) GB, each of $((NODES * GPUS)) receivers read at most $(GB "$ring_max") GB from its ring (plan: $(GB "$p_rank"); $(awk -v d="$ring_max" -v b="$model_bytes" 'BEGIN {printf "%.5f", d / b}') of the round's $(GB "$model_bytes") GB); round $secs s, plan $(printf %.3f "$p_secs") s ($p_bottleneck), predicted / measured $ratio"
  ROWS+=("| $S | $take | $(GB $p_per_sender) | ${tx_list% } | $(GB $rx_max) | $(GB "$p_rank") | $(GB "$ring_max") | $(printf %.2f "$p_secs") | $(printf %.2f "$secs") | $ratio | \`$p_bottleneck\` |")
done

echo
links="links ${RATE_MBIT} Mb/s (tc tbf, MTU $MTU)"
[ "$RATE_MBIT" -gt 0 ] || links="links not shaped (MTU $MTU), plan --shared-host"
echo "$NODES nodes x $GPUS ranks, $links, $PRESET, ${BUCKET_MB} MiB buckets, $ROUNDS round(s); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| senders | ranks take | plan GB per sender link | measured GB per sender link | node link GB (max) | plan GB per rank | ring GB read per rank (max) | predicted s | measured s | predicted / measured | bottleneck |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for row in "${ROWS[@]}"; do echo "$row"; done
[ $FAILURES -eq 0 ] && echo "all plan validation checks passed" || { echo "$FAILURES check(s) failed"; exit 1; }

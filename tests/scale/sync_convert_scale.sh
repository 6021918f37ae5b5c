#!/usr/bin/env bash
# The scale tier for weight sync and conversion: real depths, not the 2-layer models of
# the unit tests, driven through the CLI as a user would.
#   1. qwen2.5-0.5b at full depth (290 tensors, bf16): shm sync to 2 receivers, 2 rounds;
#   2. the same through 2 relays on loopback (net to each relay, encrypted, shm to 2
#      receivers each);
#   3. qwen2.5-7b at 4 layers (bf16, 2 GB of embeddings alone): shm sync to 2 receivers;
#   4. convert HF -> Megatron at TP 2 and TP 4 and back, byte-identical tensors.
# Bit-exact: every receiver prints the same content hash (XXH3 of every tensor) as the sender.
#
#   bash tests/scale/sync_convert_scale.sh build/src/cli/ferry
set -uo pipefail

FERRY=$(readlink -f "${1:?usage: sync_convert_scale.sh path/to/ferry}")
WORK=$(mktemp -d)
TAG="fysc$$"
PIDS=()
FAILURES=0
export FERRY_TOKEN
FERRY_TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
hashes() { grep -o '"content_hash":"[0-9a-f]*"' "$1" | cut -d'"' -f4 | tr '\n' ' '; }
# Waits for every pid given, at most 300 s in all; 0 only if each exited 0.
wait_all() {
  local rc=0 t=0
  for p in "$@"; do
    while kill -0 "$p" 2>/dev/null && [ $t -lt 1500 ]; do sleep 0.2; t=$((t + 1)); done
    kill -9 "$p" 2>/dev/null
    wait "$p" || rc=1
  done
  return $rc
}
# The sender's hashes must appear, in order, at every receiver's output given.
check_hashes() {
  local what=$1 sender=$2 rounds=$3; shift 3
  local want; want=$(hashes "$sender")
  [ "$(echo $want | wc -w)" -eq "$rounds" ] || { fail "$what: sender printed $(echo $want | wc -w) rounds, not $rounds"; return; }
  for f in "$@"; do
    [ "$(hashes "$f")" = "$want" ] || fail "$what: $(basename "$f") got '$(hashes "$f")', sender '$want'"
  done
}
tail_errors() { for f in "$WORK"/*.err; do echo "   --- $(basename "$f")"; tail -3 "$f" | sed 's/^/   /'; done; }

# shm_case <name> <serve args...>: a sender and two receivers on this node.
shm_case() {
  local name=$1; shift
  local start=$SECONDS
  "$FERRY" sync serve --address "@$TAG-$name" --receivers 2 --rounds 2 --json "$@" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" &
  local sender=$!; PIDS+=($sender)
  local recvs=()
  for r in 0 1; do
    "$FERRY" sync recv --address "@$TAG-$name" --id $r --rounds 2 --json \
      >"$WORK/$name.recv$r.out" 2>"$WORK/$name.recv$r.err" &
    recvs+=($!); PIDS+=($!)
  done
  if wait_all "$sender" "${recvs[@]}"; then
    check_hashes "$name" "$WORK/$name.out" 2 "$WORK/$name.recv0.out" "$WORK/$name.recv1.out"
    echo "ok: $name ($(grep -o '"tensors":[0-9]*' "$WORK/$name.out" | head -1), $((SECONDS - start)) s)"
  else
    fail "$name: a process failed"; tail_errors
  fi
  rm -f "$WORK"/*.out "$WORK"/*.err
}

# 1 and 3.
shm_case qwen05b --preset qwen2.5-0.5b --dtype bf16 --bucket-mb 128
shm_case qwen7b-4l --preset qwen2.5-7b --layers 4 --dtype bf16 --bucket-mb 512

# 2. Two relays on loopback, two receivers behind each; the weights encrypted on the wire and
# the relays requiring at least a MAC (encrypt satisfies it), so the AEAD path runs at size.
start=$SECONDS
"$FERRY" sync serve --listen 127.0.0.1:0 --receivers 2 --rounds 2 --json --preset qwen2.5-0.5b \
  --dtype bf16 --bucket-mb 128 --wire-protect encrypt >"$WORK/net.out" 2>"$WORK/net.err" &
sender=$!; PIDS+=($sender)
port=""
for _ in $(seq 1 100); do
  port=$(grep -o 'on 127.0.0.1:[0-9]*' "$WORK/net.err" | head -1 | cut -d: -f2)
  [ -n "$port" ] && break; sleep 0.1
done
[ -n "$port" ] || fail "net: the sender printed no port: $(tail -2 "$WORK/net.err")"
others=()
for id in 1 2; do
  "$FERRY" sync relay --connect "127.0.0.1:$port" --id $id --local "@$TAG-relay$id" \
    --receivers 2 --rounds 2 --json --wire-protect mac >"$WORK/relay$id.out" 2>"$WORK/relay$id.err" &
  others+=($!); PIDS+=($!)
  for r in 0 1; do
    "$FERRY" sync recv --address "@$TAG-relay$id" --id $r --rounds 2 --json \
      >"$WORK/net.recv$id.$r.out" 2>"$WORK/net.recv$id.$r.err" &
    others+=($!); PIDS+=($!)
  done
done
if wait_all "$sender" "${others[@]}"; then
  check_hashes net "$WORK/net.out" 2 "$WORK"/net.recv*.out
  echo "ok: net through 2 relays (encrypt), 4 receivers ($((SECONDS - start)) s)"
else
  fail "net: a process failed"; tail_errors
fi
rm -f "$WORK"/*.out "$WORK"/*.err

# 4. Conversion round trips: qwen2.5-0.5b at full depth through TP 2 (its 14 heads do not
# split in 4), qwen2.5-7b at 4 layers through TP 4.
# The name and XXH3 of every tensor, in name order.
tensor_hashes() { "$FERRY" inspect --hash "$1" | awk 'length($NF) == 16 && $NF ~ /^[0-9a-f]+$/ {print $1, $NF}' | sort; }
convert_case() {
  local tp=$1 tensors=$2; shift 2
  local start=$SECONDS before=$FAILURES
  "$FERRY" gen-model --dtype bf16 --out "$WORK/hf" "$@" >/dev/null || fail "gen-model $*"
  local want; want=$(tensor_hashes "$WORK/hf")
  [ "$(echo "$want" | wc -l)" -eq "$tensors" ] || fail "gen-model $*: $(echo "$want" | wc -l) tensors, not $tensors"
  if "$FERRY" convert --from hf --to megatron --tp "$tp" "$WORK/hf" "$WORK/mc" >/dev/null 2>"$WORK/c.err" &&
     "$FERRY" convert --from megatron --to hf "$WORK/mc" "$WORK/back" >/dev/null 2>>"$WORK/c.err"; then
    [ "$(tensor_hashes "$WORK/back")" = "$want" ] || fail "convert TP $tp ($*): the round trip changed tensors"
  else
    fail "convert TP $tp ($*): $(tail -2 "$WORK/c.err")"
  fi
  rm -rf "$WORK/hf" "$WORK/mc" "$WORK/back"
  [ $FAILURES -eq $before ] && echo "ok: convert TP $tp round trip, $* ($((SECONDS - start)) s)"
}
convert_case 2 290 --preset qwen2.5-0.5b
convert_case 4 51 --preset qwen2.5-7b --layers 4

[ $FAILURES -eq 0 ] && echo "sync_convert_scale: all passed" || echo "sync_convert_scale: $FAILURES failure(s)"
[ $FAILURES -eq 0 ]

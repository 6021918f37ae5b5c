#!/usr/bin/env bash
# Scale: qwen2.5-0.5b at full depth (290 tensors, bf16) saved at 8 ranks / 4 nodes, each
# node's folder verified alone and all together,
# loaded resharded to 2 ranks / 1 node and 4 ranks / 2 nodes, each bit-exact against
# the source; a load killed with SIGKILL leaves a temp the next load removes.
# Usage: ckpt_scale.sh FERRY_BINARY
set -euo pipefail
ferry=${1:?usage: ckpt_scale.sh FERRY_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# Bit-exact: the same tensor names, dtypes, shapes and bytes, and the same config.json.
same_model() {
  python3 - "$1" "$2" <<'PY' || fail "$2 differs from $1"
import json, os, struct, sys, hashlib
def tensors(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    out = {}
    for f in files:
        with open(os.path.join(d, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            h = json.loads(fh.read(n))
            for k, v in h.items():
                if k == "__metadata__": continue
                b, e = v["data_offsets"]
                fh.seek(8 + n + b)
                out[k] = (v["dtype"], v["shape"], hashlib.sha1(fh.read(e - b)).hexdigest())
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
cfg = lambda d: json.load(open(os.path.join(d, "config.json")))
if a != b:
    print("tensors differ:", sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))[:5], file=sys.stderr)
    sys.exit(1)
sys.exit(0 if cfg(sys.argv[1]) == cfg(sys.argv[2]) else 1)
PY
}

"$ferry" gen-model --preset qwen2.5-0.5b --dtype bf16 --out "$work/src" >/dev/null
n=$("$ferry" inspect "$work/src" | sed -n 's/^\([0-9]*\) tensors,.*/\1/p')
[ "$n" -eq 290 ] || fail "qwen2.5-0.5b has $n tensors, expected 290"

"$ferry" ckpt save --from "$work/src" --ranks 8 --nodes 4 "$work/ck" >/dev/null
# Each node's folder verifies alone (ferry's format keeps the manifest on every node), and
# says that the other nodes' files were not checked; all four together check every slice.
for i in 0 1 2 3; do
  "$ferry" ckpt verify "$work/ck/node$i" >"$work/verify$i.txt" || fail "node$i alone: $(cat "$work/verify$i.txt")"
  [ "$(grep -c 'no root given' "$work/verify$i.txt")" -eq 3 ] || fail "node$i alone: $(cat "$work/verify$i.txt")"
done
"$ferry" ckpt verify "$work/ck" >"$work/verify.txt" || fail "all nodes: $(cat "$work/verify.txt")"
grep -q "^step 1: OK" "$work/verify.txt" || fail "all nodes: $(cat "$work/verify.txt")"
! grep -q "no root given" "$work/verify.txt" || fail "all nodes: $(cat "$work/verify.txt")"

# 2 ranks / 1 node: one root holding every node's shards (as after copying them).
mkdir -p "$work/one/node0"
cp -r "$work/ck/node0/." "$work/one/node0/"
for i in 1 2 3; do cp "$work"/ck/node$i/step_1/*.safetensors "$work/one/node0/step_1/"; done
"$ferry" ckpt load "$work/one/node0" "$work/one/node0" --to "$work/out1" >/dev/null
same_model "$work/src" "$work/out1"

# 4 ranks / 2 nodes: each of two roots holds two of the saved nodes' shards.
for pair in "0 1" "2 3"; do
  set -- $pair
  mkdir -p "$work/two/node$1"
  cp -r "$work/ck/node$1/." "$work/two/node$1/"
  cp "$work"/ck/node$2/step_1/*.safetensors "$work/two/node$1/step_1/"
done
"$ferry" ckpt load "$work/two/node0" "$work/two/node0" "$work/two/node2" "$work/two/node2" \
  --to "$work/out2" >/dev/null
same_model "$work/src" "$work/out2"

# Straight from the 4 node roots (each rank fetches what its node lacks).
"$ferry" ckpt load "$work/ck" --to "$work/out4" >/dev/null
same_model "$work/src" "$work/out4"

# kill -9 mid-load, then a clean load into the same --to.
"$ferry" ckpt load "$work/ck" --to "$work/killed" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 200); do
  [ -e "$work/.killed.tmp.$pid/model.safetensors" ] && break
  sleep 0.02
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
[ ! -e "$work/killed" ] || [ -z "$(ls -A "$work/killed")" ] || fail "a killed load left files in --to"
"$ferry" ckpt load "$work/ck" --to "$work/killed" >/dev/null
[ ! -e "$work/.killed.tmp.$pid" ] || fail "the temp of killed load $pid was not removed"
same_model "$work/src" "$work/killed"
echo "scale.ckpt: OK"

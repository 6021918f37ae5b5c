#!/usr/bin/env bash
# Scale: a verl/Megatron checkpoint folder laid out as verl writes it on 4 nodes of 8 ranks
# (actor and critic, model/ and optimizer/ dist_ckpt folders, 3 steps: 384 shards), where
# only rank 0's node has the metadata (verl's FAQ case). Each node verified alone names what
# it lacks; one `replicate --serve` feeds three pullers side by side; afterwards every node
# verifies alone and together, its metadata is byte-identical to node0's, and no shard was
# touched.
# Usage: replicate_scale.sh FERRY_BINARY
set -euo pipefail
ferry=${1:?usage: replicate_scale.sh FERRY_BINARY}
work=$(mktemp -d)
server=""
trap '[ -z "$server" ] || kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

nodes=4 ranks_per_node=8 steps=3
python3 - "$work/ck" "$nodes" "$ranks_per_node" "$steps" <<'PY'
import os, sys
root, nodes, per_node, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def put(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
meta = b'{"sharded_backend": "torch_dist", "sharded_backend_version": 1, ' \
       b'"common_backend": "torch", "common_backend_version": 1}'
for n in range(nodes):
    for step in range(1, steps + 1):
        for role in ("actor", "critic"):
            for sub in ("model/dist_ckpt", "optimizer/dist_ckpt"):
                d = f"{root}/node{n}/global_step_{step}/{role}/{sub}"
                for r in range(per_node):
                    rank = n * per_node + r
                    put(f"{d}/__{rank}_0.distcp", os.urandom(64 << 10))
                if n == 0:  # only rank 0's node writes the metadata
                    put(f"{d}/common.pt", b"PK\x03\x04" + os.urandom(20000))
                    put(f"{d}/.metadata", b"\x80\x04\x95" + os.urandom(50000))
                    put(f"{d}/metadata.json", meta)
            if n == 0:
                put(f"{root}/node0/global_step_{step}/{role}/huggingface/config.json",
                    b'{"model_type": "qwen2"}')
                put(f"{root}/node0/global_step_{step}/{role}/transformer_config.json",
                    b'{"num_layers": 24}')
    if n == 0:
        put(f"{root}/node0/latest_checkpointed_iteration.txt", str(steps).encode())
PY
shards=$(find "$work/ck" -name '__*_0.distcp' | wc -l)
[ "$shards" -eq $((nodes * ranks_per_node * 2 * 2 * steps)) ] || fail "wrote $shards shards"
shard_sums() { (cd "$work/ck" && find . -name '__*_0.distcp' -print0 | sort -z | xargs -0 sha1sum); }
shard_sums >"$work/shards.before"

# Each node alone: node0 is whole; every other names what it lacks and the fix.
"$ferry" ckpt verify "$work/ck/node0" >/dev/null || fail "node0 alone does not verify"
for n in 1 2 3; do
  if "$ferry" ckpt verify "$work/ck/node$n" >"$work/v$n.txt"; then fail "node$n alone verified"; fi
  grep -q "MISSING node node$n .*global_step_$steps/actor/model/dist_ckpt/common.pt" "$work/v$n.txt" ||
    fail "node$n alone does not name its missing common.pt: $(head -5 "$work/v$n.txt")"
  grep -q -- "--from" "$work/v$n.txt" || fail "node$n alone does not print the replicate fix"
done
if "$ferry" ckpt verify "$work/ck" >/dev/null; then fail "the whole checkpoint verified before replication"; fi

# One server, three pullers at once.
"$ferry" token new "$work/token" >/dev/null
"$ferry" ckpt replicate "$work/ck/node0" --serve 127.0.0.1:0 --clients 3 --json \
  --token-file "$work/token" >"$work/server.out" 2>"$work/server.err" &
server=$!
for _ in $(seq 1 500); do
  address=$(sed -n 's/.*"address": *"\([^"]*\)".*/\1/p' "$work/server.out" | head -1)
  [ -n "$address" ] && break
  sleep 0.02
done
[ -n "$address" ] || fail "the server printed no address: $(cat "$work/server.err")"
pullers=()
for n in 1 2 3; do
  "$ferry" ckpt replicate "$work/ck/node$n" --from "$address" --token-file "$work/token" \
    --json >"$work/pull$n.json" 2>"$work/pull$n.err" &
  pullers+=($!)
done
for n in 1 2 3; do
  wait "${pullers[n - 1]}" || fail "puller $n failed: $(cat "$work/pull$n.err")"
done
wait "$server" || fail "the server did not exit cleanly after 3 pulls: $(cat "$work/server.err")"
server=""

# Every node now verifies alone and together; metadata equals node0's; shards untouched.
for n in 0 1 2 3; do
  "$ferry" ckpt verify "$work/ck/node$n" >/dev/null || fail "node$n alone does not verify after"
done
"$ferry" ckpt verify "$work/ck" >/dev/null || fail "the whole checkpoint does not verify after"
# What a node needs to load: each dist_ckpt folder's common.pt, .metadata and metadata.json,
# and the tracker (rank 0's huggingface/ and transformer_config.json are not loaded there).
(cd "$work/ck/node0" && find . -type f \( -name common.pt -o -name .metadata -o -name metadata.json \
  -o -name latest_checkpointed_iteration.txt \) | sort) >"$work/meta.list"
[ "$(wc -l <"$work/meta.list")" -eq $((steps * 2 * 2 * 3 + 1)) ] ||
  fail "node0 has $(wc -l <"$work/meta.list") metadata files"
for n in 1 2 3; do
  while read -r f; do
    cmp -s "$work/ck/node0/$f" "$work/ck/node$n/$f" || fail "node$n: $f differs from node0's"
  done <"$work/meta.list"
done
shard_sums >"$work/shards.after"
cmp -s "$work/shards.before" "$work/shards.after" || fail "a shard changed during replication"
echo "scale.replicate: OK ($shards shards, $(wc -l <"$work/meta.list") metadata files to 3 nodes)"

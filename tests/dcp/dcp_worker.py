"""One rank of a test job (tests/dcp): saves or loads a model of real shapes with
torch.distributed.checkpoint over gloo, each node's ranks in their own folder.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torchrun sets them) and
FERRY_DCP_NODE (this rank's node, also the name of its folder under --root).

The state: every tensor of a preset's Hugging Face checkpoint as a DTensor sharded by rows over
all ranks (as FSDP2 holds it), plus a sharded optimizer state (exp_avg of each, and a step).
Every element's value is a function of its global position, so any rank of any layout knows
what its shard must hold after a load (bit-exact check, no reference file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

import ferry
import ferry.dcp

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def expected_block(name: str, step: int, shape, offset, local_shape, dtype) -> torch.Tensor:
    """Values at rows [offset[0], offset[0] + local_shape[0]) of tensor `name` at `step`: small
    integers (exact in bf16), different per tensor, step and position."""
    cols = 1
    for d in shape[1:]:
        cols *= d
    start = offset[0] * cols if shape else 0
    count = 1
    for d in local_shape:
        count *= d
    seed = zlib.crc32(f"{name}@{step}".encode())
    i = torch.arange(start, start + count, dtype=torch.int64)
    values = ((i * 2654435761 + seed) % 251 - 125).to(dtype)
    return values.reshape(local_shape)


def make_state(specs, mesh, step: int, dtype, fill: bool) -> dict:
    """{"model": {...}, "optim": {...}}: DTensors of the preset's shapes, sharded by rows."""
    model, optim = {}, {}
    for name, _, shape in specs:
        shape = tuple(shape)
        for prefix, store, key in (("", model, name), ("exp_avg.", optim, f"exp_avg.{name}")):
            local_shape, offset = compute_local_shape_and_global_offset(shape, mesh, [Shard(0)])
            if fill:
                local = expected_block(key, step, shape, offset, local_shape, dtype)
            else:
                local = torch.full(local_shape, 7, dtype=dtype)  # overwritten by the load
            stride = torch.empty(shape, device="meta").stride()
            store[key] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                            shape=torch.Size(shape), stride=stride)
    optim["step"] = torch.tensor(float(step) if fill else -1.0)
    return {"model": model, "optim": optim}


def check_state(state: dict, mesh, step: int, dtype) -> int:
    """Bit-exact against the expected values; the number of tensors checked."""
    checked = 0
    for part in ("model", "optim"):
        for key, tensor in state[part].items():
            if key == "step":
                assert tensor.item() == float(step), f"optim step {tensor.item()} != {step}"
                continue
            shape = tuple(tensor.shape)
            local_shape, offset = compute_local_shape_and_global_offset(shape, mesh, [Shard(0)])
            want = expected_block(key, step, shape, offset, local_shape, dtype)
            got = tensor.to_local()
            if not torch.equal(got, want):
                bad = (got != want).nonzero()[:3].tolist()
                raise AssertionError(f"{part}.{key}: loaded shard differs at {bad}")
            checked += 1
    return checked


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["save", "load", "dcp-save", "dcp-load"])
    parser.add_argument("--root", required=True)
    parser.add_argument("--step", type=int, default=1)
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--tensors", default=":", help="a slice of the preset's tensors, A:B")
    parser.add_argument("--peers", default="{}", help="JSON {node: host:port}")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="the reader's timeout for reaching a file server")
    parser.add_argument("--result", help="write a JSON line of what this rank saw here")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    first, _, last = args.tensors.partition(":")
    specs = ferry.hf_tensor_specs(args.preset)[int(first or 0):int(last) if last else None]
    dtype = DTYPES[args.dtype]
    folder = os.path.join(args.root, os.environ["FERRY_DCP_NODE"], f"step_{args.step}")
    out = {"rank": rank, "node": os.environ["FERRY_DCP_NODE"]}
    try:
        if args.mode in ("save", "dcp-save"):
            state = make_state(specs, mesh, args.step, dtype, fill=True)
            if args.mode == "save":
                ferry.dcp.save(state, folder)
            else:  # DCP's own writer: the FAQ's setup
                dcp.save(state, storage_writer=dcp.FileSystemWriter(folder))
            out["tensors"] = len(state["model"])
        else:
            state = make_state(specs, mesh, args.step, dtype, fill=False)
            if args.mode == "load":
                reader = ferry.dcp.load(state, folder, peers=json.loads(args.peers),
                                        timeout_s=args.timeout_s)
                out["fetched_bytes"] = reader.fetched_bytes
            else:
                dcp.load(state, storage_reader=dcp.FileSystemReader(folder))
            out["checked"] = check_state(state, mesh, args.step, dtype)
        out["ok"] = True
    except (Exception, CheckpointException) as e:  # reported to the test, which asserts on it
        out.update(ok=False, error=f"{type(e).__name__}: {e}")
    if args.result:
        with open(args.result, "a") as f:
            f.write(json.dumps(out) + "\n")
    dist.destroy_process_group()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

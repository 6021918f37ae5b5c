"""One rank of a Megatron test job (tests/dcp/test_megatron.py): megatron-core's
dist_checkpointing (torch_dist) over gloo on CPU, each node's ranks in their own folder.

Environment: as dcp_worker.py (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, FERRY_DCP_NODE).

The state: TENSORS tensors of a preset's Hugging Face checkpoint as megatron ShardedTensors
sharded by rows over the ranks (ShardedTensor.from_rank_offsets), one tensor replicated on
every rank (replica_id = rank, as data-parallel copies), and a common, non-sharded entry
(megatron 0.16 saves it to common.pt). Values are dcp_worker.expected_block's: a function of
the global position, so any rank of any layout knows what it must load.

Modes:
  save    every phase below in turn, by the same ranks (each start of a rank costs seconds of
          imports on a small machine), each phase's outcome reported under its name:
          own     megatron's own save (default strategy) into own/: on a CPU-only torch its
                  writer's torch.cuda.synchronize() fails; where, is reported
          stock   megatron's save (serialization.save, its torch_dist strategy and planner)
                  with the shards written by DCP's FileSystemWriter, the base class of
                  megatron's FileSystemWriterAsync, into stock/: the files megatron writes on
                  GPU, each by the same rank (the FAQ's layout)
          ferry   ferry.dcp.megatron.save into step_<N>/, then ferry.dcp.megatron.load by the
                  same ranks into fresh tensors, checked bit-exact
          verl    verl 0.9.1's save_dist_checkpointing / load_dist_checkpointing after
                  `import ferry.verl.checkpoint`, into verl/: save, then a load where each rank
                  takes the rows the rank two places on saved (on the other node), bit-exact
  load        ferry.dcp.megatron.load of stock/ (refused on every rank), then of step_<N>/,
              checked bit-exact
  stock-load  megatron's own load (default strategies) of stock/, nothing of ferry
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import ferry
from dcp_worker import expected_block

TENSORS = 40  # the first of the preset's decoder-layer tensors: a few layers, fast
REPLICATED = "model.norm.weight"
COMMON = {"iteration": None, "note": "ferry", "seed": [3, 1, 4, 1, 5]}
CONTENT_METADATA = {"distrib_optim_sharding_type": "fully_sharded_model_space", "ferry": 1}


def specs(preset: str) -> list[tuple[str, tuple[int, ...]]]:
    every = ferry.hf_tensor_specs(preset)
    layers = [(n, tuple(s)) for n, _, s in every if n.startswith("model.layers.")][:TENSORS]
    return layers + [(n, tuple(s)) for n, _, s in every if n == REPLICATED]


def block(shape, owner: int, world: int) -> tuple:
    """(offset, local shape) of rows part `owner` of `world`."""
    rows = shape[0] // world
    return (owner * rows, *[0] * (len(shape) - 1)), (rows, *shape[1:])


def make_state(tensors, step: int, rank: int, world: int, fill: bool, shift: int = 0) -> dict:
    """The sharded state dict; rank holds part (rank + shift) % world of each sharded tensor."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    owner = (rank + shift) % world
    model = {}
    for name, shape in tensors:
        if name == REPLICATED:
            offset, local_shape = (0,) * len(shape), shape
        else:
            offset, local_shape = block(shape, owner, world)
        local = (expected_block(name, step, shape, offset, local_shape, torch.bfloat16) if fill
                 else torch.full(local_shape, 7, dtype=torch.bfloat16))
        model[name] = (ShardedTensor.from_rank_offsets(name, local, replica_id=rank)
                       if name == REPLICATED else
                       ShardedTensor.from_rank_offsets(name, local, (0, owner, world)))
    common = dict(COMMON, iteration=step, seed=torch.tensor(COMMON["seed"]))
    return {"model": model, "common": common}


def check_state(loaded: dict, tensors, step: int, rank: int, world: int, shift: int = 0) -> int:
    owner = (rank + shift) % world
    checked = 0
    for name, shape in tensors:
        if name == REPLICATED:
            offset, local_shape = (0,) * len(shape), shape
        else:
            offset, local_shape = block(shape, owner, world)
        want = expected_block(name, step, shape, offset, local_shape, torch.bfloat16)
        got = loaded["model"][name]
        if not torch.equal(got.view(torch.int16), want.view(torch.int16)):
            raise AssertionError(f"{name}: loaded part {owner}/{world} differs")
        checked += 1
    common = loaded["common"]
    assert common["iteration"] == step and common["note"] == COMMON["note"], common
    assert torch.equal(common["seed"], torch.tensor(COMMON["seed"])), common
    return checked


def stock_layout_strategy():
    """Megatron's torch_dist save strategy with DCP's FileSystemWriter in place of megatron's
    FileSystemWriterAsync (a FileSystemWriter subclass whose write path needs CUDA): each rank
    writes its __<rank>_*.distcp, the coordinator (rank 0) alone writes .metadata, as on GPU."""
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.strategies.torch import (
        MCoreSavePlanner, TorchDistSaveShardedStrategy,
        _replace_state_dict_keys_with_sharded_keys, mcore_to_pyt_state_dict)

    class StockLayout(TorchDistSaveShardedStrategy):
        def save(self, sharded_state_dict, checkpoint_dir):
            sharded, _, _ = _replace_state_dict_keys_with_sharded_keys(
                sharded_state_dict, self.keep_only_main_replica)
            dcp.save(mcore_to_pyt_state_dict(sharded, False),
                     storage_writer=dcp.FileSystemWriter(checkpoint_dir),
                     planner=MCoreSavePlanner(flatten_state_dict=False,
                                              can_run_decentralized_global_plan=False))

    return StockLayout("torch_dist", 1)


def where(e: BaseException) -> list[str]:
    """Where `e` was raised from: file:function per frame, outermost first."""
    frames = traceback.extract_tb(e.__traceback__)
    return [f"{os.path.basename(f.filename)}:{f.name}" for f in frames]


def run_verl(tensors, step: int, folder: str, rank: int, world: int, out: dict) -> None:
    from megatron.core import dist_checkpointing, parallel_state

    parallel_state.initialize_model_parallel(1, 1)  # tp 1, pp 1: data parallel over all ranks
    # Imported before the switch, as a verl worker has: their bound names must be replaced.
    import verl.model_merger.megatron_model_merger as merger
    import verl.utils.checkpoint.megatron_checkpoint_manager as manager
    import ferry.verl.checkpoint
    from verl.utils.megatron.dist_checkpointing import (load_dist_checkpointing,
                                                        save_dist_checkpointing)

    out["switched"] = (
        save_dist_checkpointing is ferry.verl.checkpoint.save_dist_checkpointing
        and load_dist_checkpointing is ferry.verl.checkpoint.load_dist_checkpointing
        and manager.save_dist_checkpointing is save_dist_checkpointing
        and manager.load_dist_checkpointing is load_dist_checkpointing
        and merger.load_dist_checkpointing is load_dist_checkpointing)
    try:
        save_dist_checkpointing(make_state(tensors, step, rank, world, True), folder,
                                async_save=True)
    except NotImplementedError as e:
        out["async_error"] = str(e)
    # As verl's manager calls it (_save_dist_checkpoint), then its barrier.
    save_dist_checkpointing(sharded_state_dict=make_state(tensors, step, rank, world, True),
                            ckpt_path=folder, async_save=False,
                            content_metadata=CONTENT_METADATA)
    dist.barrier()
    # verl's manager reads it back so (_load_content_metadata): common.pt, on every node.
    out["content_metadata"] = dist_checkpointing.load_content_metadata(checkpoint_dir=folder)
    loaded = load_dist_checkpointing(make_state(tensors, step, rank, world, False, shift=2),
                                     folder)
    out["checked"] = check_state(loaded, tensors, step, rank, world, shift=2)


def run_phases(tensors, step: int, root: str, node: str, rank: int, world: int) -> dict:
    from megatron.core import dist_checkpointing
    import ferry.dcp.megatron as fm

    def state(fill: bool) -> dict:
        return make_state(tensors, step, rank, world, fill)

    def own(out: dict) -> None:
        folder = os.path.join(root, node, "own")
        os.makedirs(folder, exist_ok=True)
        dist_checkpointing.save(state(True), folder)

    def stock(out: dict) -> None:
        folder = os.path.join(root, node, "stock")
        os.makedirs(folder, exist_ok=True)
        dist_checkpointing.save(state(True), folder, sharded_strategy=stock_layout_strategy())

    def ferry_dcp(out: dict) -> None:
        folder = os.path.join(root, node, f"step_{step}")
        fm.save(state(True), folder)
        dist.barrier()
        out["checked"] = check_state(fm.load(state(False), folder), tensors, step, rank, world)

    def verl(out: dict) -> None:
        run_verl(tensors, step, os.path.join(root, node, "verl"), rank, world, out)

    phases = {}
    for name, phase in (("own", own), ("stock", stock), ("ferry", ferry_dcp), ("verl", verl)):
        out: dict = {}
        try:
            phase(out)
            out["ok"] = True
        except Exception as e:  # every rank fails alike (each phase's errors are collective)
            out.update(ok=False, error=f"{type(e).__name__}: {e}", where=where(e))
        phases[name] = out
        dist.barrier()
    return phases


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["save", "load", "stock-load"])
    parser.add_argument("--root", required=True)
    parser.add_argument("--step", type=int, default=1)
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--result", help="write a JSON line of what this rank saw here")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    node = os.environ["FERRY_DCP_NODE"]
    tensors = specs(args.preset)
    out: dict = {"rank": rank, "node": node}
    try:
        from megatron.core import dist_checkpointing
        import ferry.dcp.megatron as fm

        if args.mode == "save":
            out["phases"] = run_phases(tensors, args.step, args.root, node, rank, world)
        elif args.mode == "load":
            try:  # first the stock save of phase "stock": no ferry index on any node
                fm.load(make_state(tensors, args.step, rank, world, False),
                        os.path.join(args.root, node, "stock"))
            except Exception as e:
                out["stock_error"] = f"{type(e).__name__}: {e}"
            folder = os.path.join(args.root, node, f"step_{args.step}")
            loaded = fm.load(make_state(tensors, args.step, rank, world, False), folder)
            out["checked"] = check_state(loaded, tensors, args.step, rank, world)
        else:
            folder = os.path.join(args.root, node, "stock")
            loaded = dist_checkpointing.load(make_state(tensors, args.step, rank, world, False),
                                             folder)
            out["checked"] = check_state(loaded, tensors, args.step, rank, world)
        out["ok"] = True
    except Exception as e:  # reported to the test, which asserts on it
        out.update(ok=False, error=f"{type(e).__name__}: {e}", where=where(e))
    if args.result:
        with open(args.result, "a") as f:
            f.write(json.dumps(out, default=str) + "\n")
    dist.destroy_process_group()
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

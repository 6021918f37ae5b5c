"""Megatron-core's dist_checkpointing (torch_dist) on node-local disks, through ferry.dcp.

    import ferry.dcp.megatron as fm
    fm.save(sharded_state_dict, "/local/nvme/ckpt/iter_100")   # every rank
    state_dict = fm.load(sharded_state_dict, "/local/nvme/ckpt/iter_100")   # any node, any layout

Megatron writes its shards on every rank, but `.metadata` (the coordinator's, DCP), `common.pt`
and `metadata.json` (rank 0) on rank 0's node only, so without shared storage every other node
fails to load. Here:

* save: NodeLocalSaveStrategy, a TorchDistSaveShardedStrategy whose save() runs plain
  torch.distributed.checkpoint.save with a NodeLocalWriter. The writer puts `.metadata`, the
  `metadata.json` megatron will write (the same bytes: rank 0 rewrites it afterwards and the
  index records its XXH3) and `common.pt` (megatron 0.16 writes it on rank 0 before the
  shards) on every node, then the commit marker. Megatron's own sharded save goes through
  FileSystemWriterAsync, which calls torch.cuda.synchronize() and allocates on CUDA: this
  path has none of that, so it runs on CPU (gloo) as on GPU. Async saves are not supported.
* load: megatron's own load, with its reader factory (`_get_filesystem_reader`) routed to
  NodeLocalReader while the load runs (node_local_reads()), which fetches the shard files this
  node lacks from the nodes that hold them; `common.pt` is read locally, checked against the
  node's index first (NodeLocalCommonLoadStrategy).

Tested with megatron-core 0.16.1 (tests/dcp/test_megatron.py). 0.17 and later need Python 3.12;
their common state lives in rank 0's shard file instead of common.pt, which this module
follows (nothing to replicate then), untested. It depends on three private names of
megatron's strategies/torch.py: _replace_state_dict_keys_with_sharded_keys,
mcore_to_pyt_state_dict and MCoreSavePlanner (the same in 0.16.1 and 0.19.2).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
from typing import Any, Iterator

import torch.distributed.checkpoint as dcp
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing import serialization
from megatron.core.dist_checkpointing.core import CONFIG_FNAME, CheckpointingConfig, save_config
from megatron.core.dist_checkpointing.strategies import torch as mcore_torch
from megatron.core.dist_checkpointing.strategies.torch import (
    MCoreSavePlanner,
    TorchDistSaveShardedStrategy,
    _replace_state_dict_keys_with_sharded_keys,
    mcore_to_pyt_state_dict,
)

from . import _group, _index
from .reader import NodeLocalReader
from .writer import NodeLocalWriter

__all__ = ["NodeLocalCommonLoadStrategy", "NodeLocalSaveStrategy", "load", "node_local_reads",
           "save"]

COMMON_FNAME = "common.pt"
# Megatron up to 0.16 saves the common state to common.pt (rank 0, before the shards); its
# save() then takes a common_strategy. From the release that dropped common.pt, it does not.
WRITES_COMMON_PT = "common_strategy" in inspect.signature(serialization.save).parameters
_LOAD_TAKES_COMMON_STRATEGY = "common_strategy" in inspect.signature(serialization.load).parameters

if WRITES_COMMON_PT:
    from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy
else:  # pragma: no cover - megatron-core >= 0.17 (Python 3.12)
    TorchCommonLoadStrategy = object  # type: ignore[assignment,misc]


def config_bytes(backend: str, version: int) -> bytes:
    """The bytes megatron's save writes to metadata.json for a strategy of `backend`/`version`:
    made by megatron's own save_config, so a megatron that changes the format changes both."""
    with tempfile.TemporaryDirectory(prefix="ferry-mcore-") as folder:
        save_config(CheckpointingConfig(backend, version), folder)
        with open(os.path.join(folder, CONFIG_FNAME), "rb") as f:
            return f.read()


class NodeLocalSaveStrategy(TorchDistSaveShardedStrategy):
    """Megatron's torch_dist save strategy, writing through ferry.dcp.NodeLocalWriter.

        strategy = NodeLocalSaveStrategy()          # or wrapped, as verl does:
        strategy = FullyParallelSaveStrategyWrapper(NodeLocalSaveStrategy(), dp_group)
        ferry.dcp.megatron.save(sharded_state_dict, path, sharded_strategy=strategy)

    The checkpoint is megatron's torch_dist format (any megatron load reads it where every file
    is present), plus ferry's index and commit marker on every node. `process_group` is the
    group the shards are saved over (default: the world, as megatron's); its rank 0 must be
    global rank 0, which wrote common.pt. `sync_files` is NodeLocalWriter's. Megatron's
    thread_count, cached_metadata and separation_hint are not taken: each rank writes the
    files NodeLocalWriter writes (two at most)."""

    def __init__(self, backend: str = "torch_dist", version: int = 1,
                 keep_only_main_replica: bool = True, *, process_group: Any = None,
                 sync_files: bool = True) -> None:
        super().__init__(backend, version, keep_only_main_replica)
        self.process_group = process_group
        self.sync_files = sync_files

    def save(self, sharded_state_dict: Any, checkpoint_dir: Any) -> None:
        # As megatron's async_save() up to its writer, then plain DCP: no CUDA call, and the
        # writer's collectives run inside dcp.save's write phase on every rank.
        sharded, _, _ = _replace_state_dict_keys_with_sharded_keys(
            sharded_state_dict, self.keep_only_main_replica)
        writer = NodeLocalWriter(
            checkpoint_dir, process_group=self.process_group, sync_files=self.sync_files,
            extra_files={CONFIG_FNAME: config_bytes(self.backend, self.version)},
            replicate=(COMMON_FNAME,) if WRITES_COMMON_PT else ())
        # DCP plans centrally (megatron's own save skips that collective when it can); the
        # files and .metadata have the same format either way.
        planner = MCoreSavePlanner(dedup_replicated_tensors=not self.keep_only_main_replica,
                                   flatten_state_dict=False,
                                   can_run_decentralized_global_plan=False)
        dcp.save(mcore_to_pyt_state_dict(sharded, False), storage_writer=writer,
                 planner=planner, process_group=self.process_group)

    def async_save(self, sharded_state_dict: Any, checkpoint_dir: Any) -> Any:
        raise NotImplementedError("ferry.dcp.megatron saves synchronously only: pass "
                                  "async_sharded_save=False")


class NodeLocalCommonLoadStrategy(TorchCommonLoadStrategy):
    """Megatron's common.pt load, after checking this node's copy against its committed index:
    common.pt is read with torch.load, outside DCP, so NodeLocalReader never sees it."""

    def load_common(self, checkpoint_dir: Any) -> Any:
        folder = os.fspath(checkpoint_dir)
        entry = _index.read_committed(folder).files.get(COMMON_FNAME)
        if entry is not None:
            path = os.path.join(folder, COMMON_FNAME)
            try:
                found = _index.describe(path)
            except FileNotFoundError:
                found = None
            if found != (entry.bytes, entry.xxh3):
                raise ValueError(f"ferry.dcp: {path} is missing or differs from the one this "
                                 "node's index records: it was changed after the save")
        return super().load_common(checkpoint_dir)


@contextlib.contextmanager
def node_local_reads(*, peers: dict[str, str] | None = None, token_file: str = "",
                     serve_host: str | None = None, timeout_s: float = 60.0) -> Iterator[None]:
    """While open, every torch_dist read megatron makes in this process (a load, its metadata
    reads, and on 0.17+ the common state) goes through a NodeLocalReader with these options
    (NodeLocalReader's). The factory is swapped at module level and restored on exit, so do
    not run a load of another checkpoint format in another thread meanwhile."""
    def reader(checkpoint_dir: Any, cache_metadata: bool = False, **_: Any) -> NodeLocalReader:
        return NodeLocalReader(checkpoint_dir, peers=peers, token_file=token_file,
                               serve_host=serve_host, timeout_s=timeout_s)

    # serialization imports the factory by name from 0.17 on; 0.16.1 uses it only here.
    modules = [m for m in (mcore_torch, serialization) if hasattr(m, "_get_filesystem_reader")]
    saved = [(m, m._get_filesystem_reader) for m in modules]
    for m in modules:
        m._get_filesystem_reader = reader
    try:
        yield
    finally:
        for m, factory in saved:
            m._get_filesystem_reader = factory


def save(sharded_state_dict: Any, checkpoint_dir: str, sharded_strategy: Any = None,
         common_strategy: Any = None, validate_access_integrity: bool = True,
         async_sharded_save: bool = False, **kwargs: Any) -> None:
    """megatron.core.dist_checkpointing.save() to node-local disks; every rank calls it.

    Returns once every node holds its shards, `.metadata`, `metadata.json`, `common.pt`
    (megatron 0.16) and ferry's index and commit marker, and rank 0 has rewritten
    metadata.json (the same bytes). `sharded_strategy`: a NodeLocalSaveStrategy (the default)
    or a FullyParallelSaveStrategyWrapper around one; any other would write the metadata on
    rank 0's node only, so it is refused. `common_strategy` and the other keyword arguments
    (preprocess_common_before_consistancy_check, content_metadata) are megatron's. Raises
    NotImplementedError for async_sharded_save=True. Save each checkpoint to a folder of its
    own; the folder is created on every node."""
    if async_sharded_save:
        raise NotImplementedError("ferry.dcp.megatron.save is synchronous: pass "
                                  "async_sharded_save=False")
    if sharded_strategy is None:
        sharded_strategy = NodeLocalSaveStrategy()
    base = sharded_strategy
    while hasattr(base, "base_strategy"):  # FullyParallelSaveStrategyWrapper
        base = base.base_strategy
    if not isinstance(base, NodeLocalSaveStrategy):
        raise TypeError(f"ferry.dcp.megatron.save: sharded_strategy {sharded_strategy} does not "
                        "save through a NodeLocalSaveStrategy, so the metadata would reach rank "
                        "0's node only; pass NodeLocalSaveStrategy() (wrapped or not)")
    if common_strategy is not None:  # megatron 0.16 refuses any; later ones take none
        kwargs["common_strategy"] = common_strategy
    os.makedirs(checkpoint_dir, exist_ok=True)  # each node's own; megatron expects it
    dist_checkpointing.save(sharded_state_dict, checkpoint_dir, sharded_strategy=sharded_strategy,
                            validate_access_integrity=validate_access_integrity,
                            async_sharded_save=False, **kwargs)


def load(sharded_state_dict: Any, checkpoint_dir: str, sharded_strategy: Any = None,
         common_strategy: Any = None, *, peers: dict[str, str] | None = None,
         token_file: str = "", serve_host: str | None = None, timeout_s: float = 60.0,
         **kwargs: Any) -> Any:
    """megatron.core.dist_checkpointing.load() of a checkpoint save() wrote, on any node and at
    any layout; every rank calls it. Returns what megatron's load returns.

    `sharded_strategy` (default: megatron's for the checkpoint, TorchDistLoadShardedStrategy)
    may be any torch_dist load strategy, wrapped or not: its reads are routed to
    NodeLocalReader (node_local_reads). `common_strategy` defaults to
    NodeLocalCommonLoadStrategy. `peers`, `token_file`, `serve_host`, `timeout_s` are
    NodeLocalReader's (a node of the save with no rank in this load must serve its files);
    the other keyword arguments (validate_access_integrity, strict) are megatron's.

    First every rank checks that its node holds a finished save and they compare: a save
    that did not finish, or a node without it, fails on every rank, naming them, before
    megatron reads metadata.json (which would fail on those nodes only and leave the others
    waiting in a collective)."""
    folder = os.fspath(checkpoint_dir)
    me = {"rank": _group.rank(None), "host": _group.host_name(), "error": None}
    try:
        _index.read_committed(folder)
    except (OSError, ValueError) as e:
        me["error"] = _group.error_text(e)
    _group.raise_failures(_group.gather(me, None), f"loading {folder}")
    if _LOAD_TAKES_COMMON_STRATEGY:
        kwargs["common_strategy"] = common_strategy or NodeLocalCommonLoadStrategy()
    elif common_strategy is not None:  # pragma: no cover - megatron-core >= 0.17
        raise TypeError("this megatron-core's load takes no common_strategy")
    with node_local_reads(peers=peers, token_file=token_file, serve_host=serve_host,
                          timeout_s=timeout_s):
        return dist_checkpointing.load(sharded_state_dict, checkpoint_dir,
                                       sharded_strategy=sharded_strategy, **kwargs)

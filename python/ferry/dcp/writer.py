"""NodeLocalWriter: torch.distributed.checkpoint's FileSystemWriter for node-local disks.

Each rank writes its shard files to its own node's folder, as FileSystemWriter does. Then,
still inside DCP's write phase (every rank is there), the ranks exchange what they wrote and
the lowest rank of each node writes, on every node: DCP's `.metadata`, ferry's index of every
file (bytes, XXH3) and, once every node holds both, the commit marker. DCP's finish() on the
coordinator has nothing left to do. So dcp.save() returns only when every node can load the
checkpoint, and a save killed part way leaves no commit marker on at least one node: a load
refuses it by name, and the previous checkpoint (another folder) is untouched.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import queue
from typing import Any, Mapping, Sequence

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import WriteItemType
from torch.futures import Future

from . import _group, _index
from ._testing import maybe_die


class NodeLocalWriter(FileSystemWriter):
    """Saves a checkpoint to `path` on each node's own disk; every node gets the metadata.

        ferry.dcp.save(state_dict, "/local/nvme/ckpt/step_100")   # or, with DCP directly:
        dcp.save(state_dict, storage_writer=NodeLocalWriter("/local/nvme/ckpt/step_100"))

    `path` names the same folder on every node (or, in tests, one folder per node). Save each
    checkpoint to a folder of its own: a save into a folder that holds one first withdraws its
    commit marker. `process_group` must be the group dcp.save() is given (default: the world).
    `sync_files` is FileSystemWriter's.

    Each rank writes its items in two files: `__<rank>_1.distcp` holds the small whole ones
    (under SMALL_ITEM_BYTES: scalars such as an optimizer's step, pickled objects),
    `__<rank>_0.distcp` the rest. DCP stores an item every rank holds once, in one rank's
    file, and every rank of a load reads it: on another node that costs a fetch of a small
    file, not of the rank's whole shard."""

    SMALL_ITEM_BYTES = 1 << 20

    def __init__(self, path: str | os.PathLike, *, process_group: Any = None,
                 sync_files: bool = True, extra_files: Mapping[str, bytes] | None = None,
                 replicate: Sequence[str] = ()) -> None:
        """`extra_files` ({name: bytes}) are written on every node before the commit;
        `replicate` names files the coordinator's folder holds when the shards are written
        (Megatron's common.pt): copied to every node. Both are listed in the index."""
        super().__init__(path, single_file_per_rank=True, sync_files=sync_files, overwrite=True)
        self.group = process_group
        self.extra_files = {_index.check_name(k): bytes(v) for k, v in (extra_files or {}).items()}
        self.replicate = tuple(_index.check_name(name) for name in replicate)
        self.is_coordinator = False

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self.is_coordinator = is_coordinator
        if not self.use_collectives:
            raise ValueError("ferry.dcp.NodeLocalWriter needs dcp.save's collectives "
                             "(no_dist=False): the nodes agree on the metadata through them")

    def prepare_local_plan(self, plan: Any) -> Any:
        self.fs.mkdir(self.path)
        _index.withdraw_commit(self.path)
        return super().prepare_local_plan(plan)

    def write_data(self, plan: Any, planner: Any) -> Future:
        me = {"rank": _group.rank(self.group), "host": _group.host_name(), "error": None}
        results: list = []
        try:
            results = self._write_files(plan, planner)
            maybe_die("shards_written")
            me["node"] = _group.storage_node(self.path)
            me["files"] = [self._describe(name) for name in
                           sorted({r.storage_data.relative_path for r in results})]
            me["results"] = results
            if self.is_coordinator:
                me["metadata"] = self._global_metadata(planner)
                me["storage_meta"] = self.storage_meta()
                me["extra"] = dict(self.extra_files)
                for name in self.replicate:
                    with open(os.path.join(self.path, name), "rb") as f:
                        me["extra"][name] = f.read()
        except Exception as e:  # every rank must reach the gather below: DCP raises it after
            me["error"] = _group.error_text(e)
        everyone = _group.gather(me, self.group)
        _group.raise_failures(everyone, f"saving {self.path} (writing the shards)")

        leader = _group.leaders(everyone)[me["node"]] == me["rank"]
        index_bytes = b""
        me = {"rank": me["rank"], "host": me["host"], "error": None}
        try:
            if leader:
                index_bytes = self._write_metadata_and_index(everyone)
            maybe_die("metadata_written")
        except Exception as e:
            me["error"] = _group.error_text(e)
        _group.raise_failures(_group.gather(me, self.group),
                              f"saving {self.path} (writing the metadata on every node)")

        # Every node holds its shards, .metadata and the index: commit, on every node.
        if leader:
            _index.write_commit(self.path, index_bytes)
        maybe_die("committed")
        future: Future = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list) -> None:
        """Nothing left: every node's metadata, index and commit marker were written in
        write_data(), before any rank could return from dcp.save()."""

    def _write_files(self, plan: Any, planner: Any) -> list:
        small = [item for item in plan.items if _small_and_whole(item, self.SMALL_ITEM_BYTES)]
        large = [item for item in plan.items if not _small_and_whole(item, self.SMALL_ITEM_BYTES)]
        files: queue.Queue = queue.Queue()
        for number, items in ((0, large), (1, small)):
            if items:
                name = f"{plan.storage_data.prefix}{number}.distcp"
                files.put((self.fs.concat_path(self.path, name), name, items))
        return self._write_data(planner, files).value()  # FileSystemWriter's, one thread

    def _describe(self, name: str) -> dict:
        size, digest = _index.describe(os.path.join(self.path, _index.check_name(name)))
        return {"path": name, "bytes": size, "xxh3": digest}

    def _global_metadata(self, planner: Any) -> Metadata:
        # DefaultSavePlanner (and Megatron's, which derives from it) keeps the global metadata
        # it made in create_global_plan(); DCP hands it to finish() on the coordinator only.
        metadata = getattr(planner, "metadata", None)
        if not isinstance(metadata, Metadata):
            raise TypeError(f"ferry.dcp.NodeLocalWriter needs a planner that keeps its global "
                            f"metadata in .metadata (DefaultSavePlanner does); "
                            f"{type(planner).__name__} does not")
        return copy.copy(metadata)

    def _write_metadata_and_index(self, everyone: list[dict]) -> bytes:
        """As FileSystemWriter.finish() does on the coordinator, on this node, then the index."""
        # The coordinator's metadata and storage_meta: the same bytes on every node.
        coordinator = next(p for p in everyone if "metadata" in p)
        metadata = coordinator["metadata"]
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for p in everyone for r in p["results"]}
        metadata.storage_meta = coordinator["storage_meta"]
        metadata_bytes = pickle.dumps(metadata)
        _index.write_atomic(self.path, _index.METADATA, metadata_bytes, fsync=self.sync_files)

        files = {f["path"]: _index.FileEntry(f["path"], f["bytes"], f["xxh3"], p["rank"], p["host"])
                 for p in everyone for f in p["files"]}
        replicated = [_index.METADATA]
        for name, data in coordinator["extra"].items():
            _index.write_atomic(self.path, name, data, fsync=self.sync_files)
            replicated.append(name)
        for name in replicated:
            size, digest = _index.describe(os.path.join(self.path, name))
            files[name] = _index.FileEntry(name, size, digest, -1, "every node")
        nodes: dict[str, list[int]] = {}
        hosts: dict[str, str] = {}
        for p in everyone:
            nodes.setdefault(p["node"], []).append(p["rank"])
            hosts[p["node"]] = p["host"]
        index = _index.Index(save_id=metadata.storage_meta.save_id, world_size=len(everyone), files=files,
                             replicated=tuple(replicated),
                             nodes=tuple((hosts[n], tuple(r)) for n, r in nodes.items()))
        data = _index.encode(index)
        _index.write_atomic(self.path, _index.INDEX, data, fsync=self.sync_files)
        return data


def _small_and_whole(item: Any, limit: int) -> bool:
    """A pickled object, or a whole tensor (not a shard) of under `limit` bytes."""
    if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
        return True
    chunk = item.tensor_data.chunk
    if tuple(chunk.sizes) != tuple(item.tensor_data.size) or any(chunk.offsets):
        return False
    return math.prod(chunk.sizes) * item.tensor_data.properties.dtype.itemsize < limit

"""ferry.dcp: torch.distributed.checkpoint on node-local disks, loadable from any node.

    import ferry.dcp
    ferry.dcp.save(state_dict, "/local/nvme/ckpt/step_100")   # every rank
    ferry.dcp.load(state_dict, "/local/nvme/ckpt/step_100")   # every rank, any world size

DCP's FileSystemWriter writes `.metadata` on the coordinator's node only, so on nodes without
shared storage every other node fails to load (verl's FAQ: FileNotFoundError .metadata).
NodeLocalWriter writes the metadata and an index of every file (bytes, XXH3) on every node,
then a commit marker; NodeLocalReader fetches the shard files its plan needs from the nodes
that hold them, checked against that index. docs/checkpoint.md has the details.
"""

from __future__ import annotations

import os
from typing import Any

from ._index import NotCommittedError, read_committed
from .reader import NodeLocalReader
from .writer import NodeLocalWriter

__all__ = ["NodeLocalReader", "NodeLocalWriter", "NotCommittedError", "load", "read_committed",
           "save"]


def save(state_dict: dict, path: str | os.PathLike, *, process_group: Any = None,
         planner: Any = None, **writer_kwargs: Any) -> Any:
    """dcp.save() through a NodeLocalWriter; returns DCP's Metadata."""
    import torch.distributed.checkpoint as dcp

    writer = NodeLocalWriter(path, process_group=process_group, **writer_kwargs)
    return dcp.save(state_dict, storage_writer=writer, planner=planner,
                    process_group=process_group)


def load(state_dict: dict, path: str | os.PathLike, *, process_group: Any = None,
         planner: Any = None, **reader_kwargs: Any) -> NodeLocalReader:
    """dcp.load() through a NodeLocalReader, into `state_dict` in place; returns the reader
    (its fetched_bytes says what this rank moved)."""
    import torch.distributed.checkpoint as dcp

    reader = NodeLocalReader(path, process_group=process_group, **reader_kwargs)
    dcp.load(state_dict, storage_reader=reader, planner=planner, process_group=process_group)
    return reader

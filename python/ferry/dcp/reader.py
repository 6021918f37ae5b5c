"""NodeLocalReader: torch.distributed.checkpoint's FileSystemReader for node-local disks.

Every node holds the metadata (NodeLocalWriter put it there), so planning needs nothing from
other nodes. In DCP's read phase, before reading, the ranks compare what their plans need with
what their nodes hold; each node's lowest rank serves its node's files and fetches what its
node lacks from a node that has it, each file checked against this node's committed index.
Then every rank reads locally, as FileSystemReader does. A load at another world size (DCP
reshards) fetches only the files its plan touches.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.futures import Future

from . import _fetch, _group, _index


class NodeLocalReader(FileSystemReader):
    """Loads a checkpoint NodeLocalWriter saved, from any node and at any world size.

        ferry.dcp.load(state_dict, "/local/nvme/ckpt/step_100")   # or, with DCP directly:
        dcp.load(state_dict, storage_reader=NodeLocalReader("/local/nvme/ckpt/step_100"))

    Files this node lacks come from the nodes of this load that hold them, over ferry's
    authenticated net transport (a one-time secret shared through the process group). For
    files on a node with no rank in this load, run `python -m ferry.dcp serve FOLDER` there and
    name it in `peers` ({host as the index records it: "host:port"}; those servers use
    FERRY_TOKEN or FERRY_TOKEN_FILE, as `token_file` here). `process_group` must be the group
    dcp.load() is given. `serve_host`: the address other nodes reach this one at (default:
    FERRY_DCP_HOST, else this host's address on the route to MASTER_ADDR)."""

    def __init__(self, path: str | os.PathLike, *, process_group: Any = None,
                 peers: dict[str, str] | None = None, token_file: str = "",
                 serve_host: str | None = None, timeout_s: float = 60.0) -> None:
        super().__init__(path)
        self.group = process_group
        self.peers = dict(peers or {})
        self.token_file = token_file
        self.serve_host = serve_host
        self.timeout_s = timeout_s
        self.index: _index.Index | None = None
        self.fetched_bytes = 0  # what this rank fetched in its last load

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rank") is not None:  # DCP's fallback to per-rank metadata: none here
            raise FileNotFoundError("ferry.dcp writes no per-rank metadata")
        folder = os.fspath(self.path)
        self.index = _index.read_committed(folder)
        entry = self.index.files[_index.METADATA]
        path = os.path.join(folder, _index.METADATA)
        if _index.describe(path) != (entry.bytes, entry.xxh3):
            raise ValueError(f"ferry.dcp: {path} differs from the one this node's index "
                             "records: it was changed after the save")
        return super().read_metadata()

    def read_data(self, plan: Any, planner: Any) -> Future:
        self._fetch_missing(plan)
        return super().read_data(plan, planner)

    # ------------------------------------------------------------------------------------------

    def _fetch_missing(self, plan: Any) -> None:
        """Every rank runs this, in DCP's read phase, whatever happens: three gathers at most."""
        folder = os.fspath(self.path)
        me: dict = {"rank": _group.rank(self.group), "host": _group.host_name(), "error": None}
        try:
            me["node"] = _group.storage_node(folder)
            needed = {_index.check_name(self.storage_data[item.storage_index].relative_path)
                      for item in plan.items}
            me["missing"] = sorted(p for p in needed if not self._present(p))
            me["present"] = sorted(p for p in self.index.files if self._present(p))
        except Exception as e:
            me["error"] = _group.error_text(e)
        everyone = _group.gather(me, self.group)
        _group.raise_failures(everyone, f"loading {folder} (finding the files)")
        if not any(p["missing"] for p in everyone):
            return

        leaders = _group.leaders(everyone)
        by_rank = {p["rank"]: p for p in everyone}
        am_leader = leaders[me["node"]] == me["rank"]
        wanted: dict[str, set[str]] = {}  # per node: what its ranks lack
        for p in everyone:
            wanted.setdefault(p["node"], set()).update(p["missing"])
        holders: dict[str, list[str]] = {}  # per file: the nodes (of this load) that hold it
        for node, leader in leaders.items():
            for path in by_rank[leader]["present"]:
                holders.setdefault(path, []).append(node)
        needed_anywhere = set().union(*wanted.values())
        serving = am_leader and any(p in needed_anywhere for p in by_rank[me["rank"]]["present"])

        with contextlib.ExitStack() as stack:
            me = {"rank": me["rank"], "host": me["host"], "node": me["node"], "error": None}
            try:
                if serving:
                    token_path, token = stack.enter_context(_fetch.token_file())
                    entries = [self.index.files[p] for p in by_rank[me["rank"]]["present"]]
                    server = _fetch.serve(folder, entries, self.serve_host or
                                          _group.reachable_host(), token_path)
                    stack.callback(server.close)
                    me["server"] = (server.address, token)
            except Exception as e:
                me["error"] = _group.error_text(e)
            servers = _group.gather(me, self.group)
            _group.raise_failures(servers, f"loading {folder} (starting the file servers)")
            address = {p["node"]: p["server"] for p in servers if p.get("server")}

            me = {"rank": me["rank"], "host": me["host"], "error": None}
            try:
                if am_leader:
                    self.fetched_bytes = self._fetch_node_files(
                        folder, sorted(wanted[by_rank[me["rank"]]["node"]]), holders, address,
                        {leaders[n]: by_rank[leaders[n]]["host"] for n in leaders}, leaders)
            except Exception as e:
                me["error"] = _group.error_text(e)
            # The servers stay up until every node has what it needs.
            _group.raise_failures(_group.gather(me, self.group),
                                  f"loading {folder} (fetching files from other nodes)")

    def _fetch_node_files(self, folder: str, paths: list[str], holders: dict[str, list[str]],
                          address: dict[str, tuple[str, str]], hosts: dict[int, str],
                          leaders: dict[str, int]) -> int:
        by_source: dict[tuple[str, str], list[_index.FileEntry]] = {}
        for path in paths:
            entry = self.index.files[path]
            nodes = [n for n in holders.get(path, []) if n in address]
            if nodes:
                # Files spread over their holders; every node asks the same holder for a file.
                node = nodes[zlib.crc32(path.encode()) % len(nodes)]
                addr, token = address[node]
                source = (f"rank {leaders[node]} on {hosts[leaders[node]]} ({addr})", addr, token)
            elif entry.host in self.peers:
                source = (f"the server for {entry.host} at {self.peers[entry.host]}",
                          self.peers[entry.host], None)
            else:
                held = sorted(e.path for e in self.index.files.values() if e.host == entry.host
                              and e.path in paths)
                raise FileNotFoundError(
                    f"{', '.join(held)} (written by {entry.host}) are on no node of this load: "
                    f"run `python -m ferry.dcp serve {folder}` on {entry.host} and pass "
                    f"peers={{'{entry.host}': 'HOST:PORT'}}, or load with ranks on that node")
            by_source.setdefault(source, []).append(entry)
        moved = 0
        for (name, addr, token), entries in by_source.items():
            try:
                if token is None:
                    moved += _fetch.fetch(addr, folder, entries, self.token_file, self.timeout_s)
                else:
                    with _fetch.token_file(token) as (token_path, _):
                        moved += _fetch.fetch(addr, folder, entries, token_path, self.timeout_s)
            except Exception as e:  # the same error type, saying what was being fetched
                files = ", ".join(entry.path for entry in entries)
                wrapped = type(e)(f"fetching {files} from {name}: {e}")
                if hasattr(e, "code"):
                    wrapped.code = e.code
                raise wrapped from None
        return moved

    def _present(self, path: str) -> bool:
        entry = self.index.files.get(path)
        if entry is None:
            raise ValueError(f"ferry.dcp: the plan reads {path}, which this node's index does "
                             "not list: .metadata and the index disagree")
        try:
            return os.path.getsize(os.path.join(os.fspath(self.path), path)) == entry.bytes
        except FileNotFoundError:
            return False

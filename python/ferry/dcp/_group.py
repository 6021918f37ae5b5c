"""The few collectives ferry.dcp adds inside DCP's phases, over the caller's process group.

DCP runs each phase (plan, write, read) on every rank and gathers the ranks' exceptions
afterwards, so a rank that raises inside a phase still reaches the next DCP collective. Ours
must keep that promise: every rank calls gather() at the same points whatever happened before,
carrying its error instead of raising, and raises only once everyone knows (raise_failures).
What travels here travels where DCP's own plans and metadata travel (pickled by
all_gather_object): the process group is trusted; ferry's file transfers are not, and carry
no pickle.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch.distributed as dist


def active(group: Any) -> bool:
    return dist.is_available() and dist.is_initialized()


def rank(group: Any) -> int:
    return dist.get_rank(group) if active(group) else 0


def gather(obj: Any, group: Any) -> list[Any]:
    """Every rank's `obj`, in group rank order."""
    if not active(group):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def raise_failures(everyone: list[dict], what: str) -> None:
    """Raises on every rank, with every rank's error, when any rank reported one."""
    failed = [(p["rank"], p["host"], p["error"]) for p in everyone if p.get("error")]
    if not failed:
        return
    lines = "; ".join(f"rank {r} on {h}: {e}" for r, h, e in failed)
    raise RuntimeError(f"ferry.dcp: {what} failed on {len(failed)} of {len(everyone)} ranks: "
                       f"{lines}")


def host_name() -> str:
    """This node's name in the index and in messages: FERRY_DCP_NODE when set (tests, or hosts
    whose names are not unique), else the host name."""
    return os.environ.get("FERRY_DCP_NODE") or socket.gethostname()


def storage_node(folder: str | os.PathLike) -> str:
    """Which ranks share a disk: the same folder (device and inode) on the same booted machine.
    Ranks of one node in one folder agree; two nodes, or two folders standing in for two nodes
    in a test, do not. Two hosts on one shared file system count as two nodes, which is safe:
    each writes the same replicated files, atomically."""
    st = os.stat(folder)
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    return f"{host_name()}/{boot}/{st.st_dev}:{st.st_ino}"


def leaders(everyone: list[dict]) -> dict[str, int]:
    """The lowest rank of each storage node: it writes and serves that node's files."""
    first: dict[str, int] = {}
    for p in everyone:
        first.setdefault(p["node"], p["rank"])
    return first


def reachable_host() -> str:
    """The address other nodes can reach this one at: FERRY_DCP_HOST when set, else this host's
    address on the route to MASTER_ADDR (where the process group meets), else loopback."""
    explicit = os.environ.get("FERRY_DCP_HOST")
    if explicit:
        return explicit
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
                return s.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"

"""ferry as a verl checkpoint-engine backend, registered as "ferry".

    actor_rollout_ref.rollout.checkpoint_engine.backend=ferry
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=ferry.verl.checkpoint_engine

verl's CheckpointEngineManager runs, per update: prepare() on every rank -> build_topology()
-> init_process_group() -> send_weights() (actor ranks) beside receive_weights() (rollout
ranks) -> finalize(). The master actor rank serves one ferry session per kind of peer: an shm
session (abstract socket) for rollout ranks on its node, a net session (host:port, UCX,
token-authenticated) for rollout ranks on other nodes. Other actor ranks take part in every
call and iterate their generator, sending nothing. Sessions persist across updates: they are rebuilt only when the
rollout membership (node, pid of each rank) changed or the last update failed.

global_steps travels as the round's first tensor, VERSION_TENSOR (the Python API has no
version field); a receiver refuses a version older than its last or than the one it asks
for. docs/verl.md has the engine kwargs.
"""

from __future__ import annotations

import asyncio
import os
import queue
import random
import socket
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Iterable

import torch

from .. import _ferry
from .._tensors import _error, arg_bytes, tensor_arg, to_torch
from .._verl_compat import CheckpointEngine, CheckpointEngineRegistry
from ..sync import Receiver, Sender, SyncOptions
from . import _items  # a sync or async generator of (name, tensor), as verl gives either

VERSION_TENSOR = "__ferry.global_steps__"
DEFAULT_TIMEOUT_S = 600.0  # verl's wait for a peer; a dead peer is seen at once anyway
# engine_kwargs.ferry.* this backend reads; any other is warned about once, by name.
ENGINE_KWARGS = frozenset({"token_file", "slots", "interface", "port", "timeout_s",
                           "node_id", "checksums", "round_bytes"})
_warned: set[str] = set()
_DONE = object()


def _warn_unknown(kwargs: dict) -> None:
    for key in kwargs:
        if key not in ENGINE_KWARGS and key not in _warned:
            _warned.add(key)
            warnings.warn(f"ferry checkpoint engine: unknown engine_kwargs key '{key}' is "
                          "ignored", stacklevel=3)


def node_identity() -> str:
    """This machine's identity: hostname plus machine-id (or boot id), as ranks on one node
    share shared memory and ranks on two nodes never do, whatever their hostnames."""
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path) as f:
                ident = f.read().strip()
            if ident:
                return f"{socket.gethostname()}/{ident}"
        except OSError:
            continue
    return socket.gethostname()


def _free_port(host: str) -> int:
    """A port free on `host` now, for the master to bind once the topology is built. Chosen
    below the kernel's ephemeral range when it can be: a port bind(0) gives can be taken by
    any outgoing connection on the node before the master binds it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(max(1024, ephemeral_low - 12768), ephemeral_low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class _EndOfUpdate:
    """Queued after an update's last tensor; set once the consumer reached it."""

    def __init__(self) -> None:
        self.taken = threading.Event()


@CheckpointEngineRegistry.register("ferry")
class FerryCheckpointEngine(CheckpointEngine):
    """verl checkpoint engine over ferry's sync sessions (see the module docstring).

    bucket_size: bytes of one ring slot (verl passes update_weights_bucket_megabytes << 20).
    is_master: the actor rank that sends. engine_kwargs: ENGINE_KWARGS (docs/verl.md).
    """

    wire_format = "ferry"

    def __init__(self, bucket_size: int, is_master: bool = False, **engine_kwargs: Any) -> None:
        _warn_unknown(engine_kwargs)
        self.bucket_size = int(bucket_size)
        self.is_master = bool(is_master)
        self.slots = int(engine_kwargs.get("slots", 2))
        self.timeout_s = float(engine_kwargs.get("timeout_s", DEFAULT_TIMEOUT_S))
        self.checksums = bool(engine_kwargs.get("checksums", True))
        self.node_id = str(engine_kwargs.get("node_id") or node_identity())
        self.round_bytes = int(engine_kwargs.get("round_bytes",
                                                 max(2 * self.bucket_size, 1 << 30)))
        token_file = engine_kwargs.get("token_file")
        if token_file:  # read by ferry's net transport (SyncOptions has no field in Python)
            os.environ["FERRY_TOKEN_FILE"] = str(token_file)
        self._interface = engine_kwargs.get("interface")
        self._port = engine_kwargs.get("port")
        self._shm_address = f"@ferry-verl-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._net_address: str | None = None
        # Master: one Sender per kind of peer; rollout: one Receiver.
        self._senders: dict[str, Sender] = {}
        self._receiver: Receiver | None = None
        self._plan: dict | None = None      # the topology the sessions were built for
        self._role = "idle"
        self._broken = False                # the last update failed: rebuild next time
        self._last_version: int | None = None
        self.sessions_built = 0             # how often sessions were (re)built, for tests

    # -- verl's sequence --------------------------------------------------------------------

    def prepare(self) -> dict[str, Any]:
        """Metadata for build_topology: where this rank runs and, on the master, where it
        serves (same addresses every update, so sessions can persist)."""
        meta = {"host": socket.gethostname(), "node": self.node_id, "pid": os.getpid(),
                "is_master": self.is_master}
        if self.is_master:
            meta["shm"] = self._shm_address
            meta["net"] = self._net()
        return meta

    @classmethod
    def build_topology(cls, trainer_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list], dict[str, list]]:
        """Per-rank init_process_group kwargs: rollout ranks on the master's node join its
        shm session, the others its net session; receiver ids count within each session."""
        if len(metadata) != trainer_world_size + rollout_world_size:
            raise _error(_ferry.InvalidArgumentError,
                         f"build_topology: {len(metadata)} metadata entries for "
                         f"{trainer_world_size} trainer + {rollout_world_size} rollout ranks")
        trainer, rollout = metadata[:trainer_world_size], metadata[trainer_world_size:]
        masters = [m for m in trainer if m.get("is_master")]
        if len(masters) != 1:
            raise _error(_ferry.InvalidArgumentError,
                         f"build_topology: {len(masters)} trainer ranks are master; need one")
        master = masters[0]
        local = [m["node"] == master["node"] for m in rollout]
        if not all(local) and not master["net"]:
            raise _error(_ferry.InvalidArgumentError,
                         "build_topology: rollout ranks run on other nodes, but the master's "
                         f"hostname '{master.get('host')}' does not resolve to an address to serve "
                         "them on: set engine_kwargs.ferry.interface")
        plan = {"shm": master["shm"], "net": master["net"],
                "shm_receivers": sum(local), "net_receivers": len(local) - sum(local),
                "members": [(m["node"], m["pid"]) for m in rollout]}
        ids = {"shm": 0, "net": 0}
        kinds, receiver_ids = [], []
        for is_local in local:
            kind = "shm" if is_local else "net"
            kinds.append(kind)
            receiver_ids.append(ids[kind])
            ids[kind] += 1
        trainer_kwargs = {"role": ["master" if m is master else "idle" for m in trainer],
                          "plan": [plan] * trainer_world_size}
        rollout_kwargs = {"role": ["receiver"] * rollout_world_size, "kind": kinds,
                          "receiver_id": receiver_ids, "plan": [plan] * rollout_world_size}
        return trainer_kwargs, rollout_kwargs

    def init_process_group(self, role: str, plan: dict, kind: str = "",
                           receiver_id: int = 0) -> None:
        """Joins the topology; keeps the sessions of the last update when it is unchanged."""
        self._role = role
        if role == "idle":
            return
        if plan == self._plan and not self._broken and self._sessions_alive():
            return
        self.close()
        if role == "master":
            self._serve(plan)
        else:
            self._join(plan, kind, receiver_id)
        self._plan = plan
        self._broken = False
        self.sessions_built += 1

    def finalize(self) -> None:
        """Nothing to free: the sessions stay for the next update (close() ends them)."""

    async def send_weights(self, weights: Iterable | AsyncIterator,
                           global_steps: int | None = None) -> dict[str, Any]:
        """Sends one update (master) and returns its metrics. Other actor ranks iterate the
        generator without sending (it may run collectives every rank must join), return {}."""
        if self._role != "master":
            async for _ in _items(weights):
                pass
            return {}
        loop = asyncio.get_running_loop()
        version = [] if global_steps is None else [
            tensor_arg(VERSION_TENSOR, torch.tensor([int(global_steps)], dtype=torch.int64))]
        start = time.monotonic()
        total_bytes = tensors = 0
        slowest: dict[str, float] = {}
        args, names, held = list(version), set(), 0  # args: (arg, owner of its memory)

        async def send(more_follows: bool) -> None:
            nonlocal args, names, held
            stats = await loop.run_in_executor(None, self._send_round,
                                               [a for a, _ in args], more_follows)
            for kind, s in stats.items():
                slowest[kind] = slowest.get(kind, 0.0) + s.seconds
            args, names, held = list(version), set(), 0

        try:
            async for name, tensor in _items(weights):
                # A private copy at yield time: verl's generators may refill their buffer.
                arg, owner = tensor_arg(name, tensor, copy=True)
                size = arg_bytes(arg)
                if names and (name in names or held + size > self.round_bytes):
                    await send(more_follows=True)
                args.append((arg, owner))
                names.add(name)
                held += size
                total_bytes += size
                tensors += 1
            await send(more_follows=False)
        except BaseException:
            self._broken = True
            raise
        seconds = time.monotonic() - start
        return {"ferry/bytes": total_bytes, "ferry/tensors": tensors, "ferry/seconds": seconds,
                "ferry/gbps": total_bytes / seconds / 1e9 if seconds > 0 else 0.0,
                **{f"ferry/{kind}_seconds": s for kind, s in slowest.items()}}

    async def receive_weights(self, global_steps: int | None = None) -> AsyncIterator:
        """Yields (name, tensor) of one update, as host tensors this caller owns.

        Refuses (the sender's send_weights raises AbortedError naming it) an update whose
        version is older than the last one received or than global_steps.
        """
        if self._receiver is None:
            raise _error(_ferry.FailedPreconditionError,
                         "receive_weights before init_process_group joined a session")
        loop = asyncio.get_running_loop()
        items: queue.Queue = queue.Queue(maxsize=64)  # bounds what waits for the consumer
        stop = threading.Event()
        worker = threading.Thread(target=self._receive_update,
                                  args=(global_steps, items, stop), daemon=True)
        worker.start()
        try:
            while True:
                item = await loop.run_in_executor(None, items.get)
                if item is _DONE:
                    break
                if isinstance(item, _EndOfUpdate):
                    item.taken.set()
                    continue
                if isinstance(item, BaseException):
                    self._broken = True
                    raise item
                yield item
        finally:
            stop.set()
            await loop.run_in_executor(None, worker.join)

    # -- sessions ---------------------------------------------------------------------------

    def close(self) -> None:
        """Ends this rank's sessions (the peers see them end)."""
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
        self._plan = None

    @property
    def session_ids(self) -> dict[str, int]:
        if self._receiver is not None:
            return {"receiver": self._receiver.session_id}
        return {kind: s.session_id for kind, s in self._senders.items()}

    def _net(self) -> str | None:
        if self._net_address is None:
            host = self._interface
            if not host:
                try:
                    host = socket.gethostbyname(socket.gethostname())
                except OSError:  # colocated ranks need no net address; build_topology checks
                    return None
            port = int(self._port) if self._port else _free_port(host)
            self._net_address = f"{host}:{port}"
        return self._net_address

    def _options(self) -> SyncOptions:
        return SyncOptions(bucket_bytes=self.bucket_size, slots=self.slots,
                           timeout=self.timeout_s, idle_timeout=-1.0, checksums=self.checksums)

    def _sessions_alive(self) -> bool:
        if self._receiver is not None:
            return not self._receiver.closed
        return bool(self._senders) and not any(s.closed for s in self._senders.values())

    def _serve(self, plan: dict) -> None:
        wanted = {k: plan[f"{k}_receivers"] for k in ("shm", "net") if plan[f"{k}_receivers"]}
        try:
            for kind in wanted:
                sender = Sender(plan[kind], options=self._options())
                self._senders[kind] = sender
            with ThreadPoolExecutor(len(wanted) or 1) as pool:  # both kinds join at once
                for f in [pool.submit(self._senders[k].accept, n) for k, n in wanted.items()]:
                    f.result()
        except BaseException:
            self.close()
            raise

    def _join(self, plan: dict, kind: str, receiver_id: int) -> None:
        # The master closes its old session and serves anew meanwhile: a connect that lands
        # on the closing one is turned down or cut off, so try again until the timeout.
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self._receiver = Receiver(plan[kind], receiver_id,
                                          timeout=max(deadline - time.monotonic(), 0.001))
                return
            except (_ferry.IoError, _ferry.AbortedError, _ferry.NotFoundError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _send_round(self, args: list, more_follows: bool) -> dict[str, Any]:
        if len(self._senders) == 1:
            kind, sender = next(iter(self._senders.items()))
            return {kind: sender._impl.send_round(args, more_follows)}
        with ThreadPoolExecutor(len(self._senders)) as pool:  # one copy of args feeds both
            futures = {k: pool.submit(s._impl.send_round, args, more_follows)
                       for k, s in self._senders.items()}
            return {k: f.result() for k, f in futures.items()}

    def _receive_update(self, required: int | None, items: queue.Queue,
                        stop: threading.Event) -> None:
        """Receiver thread: receives the update's rounds and queues host copies."""
        receiver = self._receiver

        def put(item: Any) -> None:
            while not stop.is_set():
                try:
                    items.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue
            raise _error(_ferry.AbortedError, "receive_weights was abandoned by its caller")

        def on_bucket(views: list, is_last: bool) -> None:
            for name, dtype, shape, memory in views:
                tensor = to_torch(dtype, shape, memory)
                if name == VERSION_TENSOR:
                    self._check_version(int(tensor[0]), required)
                else:
                    put((name, tensor.clone()))
            if is_last:
                # The update is acknowledged only once the caller took every tensor, so a
                # rank that dies while loading fails the sender's send_weights too.
                end = _EndOfUpdate()
                put(end)
                while not end.taken.wait(0.1):
                    if stop.is_set():
                        raise _error(_ferry.AbortedError,
                                     "receive_weights was abandoned by its caller")

        try:
            while receiver._impl.receive_round_buckets(on_bucket).more_follows:
                pass
            put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            try:
                items.put(e, timeout=1.0)
            except queue.Full:
                pass

    def _check_version(self, version: int, required: int | None) -> None:
        known = [v for v in (self._last_version, required) if v is not None]
        floor = max(known) if known else None
        if floor is not None and version < floor:
            raise _error(_ferry.FailedPreconditionError,
                         f"stale weights: update for global_steps {version}, but this rollout "
                         f"rank has or requires {floor}")
        self._last_version = version


__all__ = ["FerryCheckpointEngine", "VERSION_TENSOR", "ENGINE_KWARGS", "node_identity"]

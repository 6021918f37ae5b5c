"""ferry as a verl checkpoint-engine backend, registered as "ferry".

    actor_rollout_ref.rollout.checkpoint_engine.backend=ferry
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=ferry.verl.checkpoint_engine

verl's CheckpointEngineManager runs, per update: prepare() on every rank -> build_topology()
-> init_process_group() -> send_weights() (actor ranks) beside receive_weights() (rollout
ranks) -> finalize(). The master actor rank serves one ferry session per kind of peer: an shm
session (abstract socket) for rollout ranks on its node, a net session (host:port, UCX,
token-authenticated) for one relay per other node. Each such node's first rollout rank hosts
the node's relay (ferry.Relay, in a background thread): it receives every byte once from the
master and republishes it over shm to the node's rollout ranks, itself included. Other actor
ranks take part in every call and iterate their generator, sending nothing. Sessions persist
across updates. Whether they do is decided once, for every rank, by build_topology from what
each rank's prepare() reports: the sessions' epoch (the master's, which names its engine
instance and counts its rebuilds) and whether they are healthy. Any failed or unfinished
update, any rank new, replaced or gone, and every rank rebuilds under a new epoch: no rank
guesses alone, so none waits for a peer that kept its old session.

global_steps travels in every round's BEGIN as the round's step (Sender.send_round's
`step`); a receiver refuses, before any tensor of it is delivered, an update whose step is
older than the last it received or than the one it asks for. docs/verl.md has the engine
kwargs.
"""

from __future__ import annotations

import asyncio
import functools
import os
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
from .._tensors import _error, arg_bytes, tensor_arg, to_torch, typed
from .._verl_compat import CheckpointEngineRegistry, CheckpointEngineWithCache
from ..sync import Receiver, Relay, Sender, SyncOptions
from ._device import device_for
from ._device_path import DevicePath
from ._handoff import Handoff, Update
from ._memory import backed_buffer
from . import _items  # a sync or async generator of (name, tensor), as verl gives either

DEFAULT_TIMEOUT_S = 600.0  # verl's wait for a peer; a dead peer is seen at once anyway
# The master's staging buffer, where a staged update (the first) gathers the tensors it must
# copy: small, as each of its pages costs a fault once (a tensor that does not fit is sent
# from the caller's memory instead, so a larger buffer saves only rounds).
DEFAULT_ROUND_BYTES = 64 << 20
# engine_kwargs.ferry.* this backend reads; any other is warned about once, by name.
ENGINE_KWARGS = frozenset({"token_file", "slots", "interface", "port", "timeout_s",
                           "node_id", "checksums", "round_bytes", "cache", "device"})
_warned: set[str] = set()


def _warn_unknown(kwargs: dict) -> None:
    for key in kwargs:
        if key not in ENGINE_KWARGS and key not in _warned:
            _warned.add(key)
            warnings.warn(f"ferry checkpoint engine: unknown engine_kwargs key '{key}' is "
                          "ignored", stacklevel=3)


def node_identity() -> str:
    """This rank's node as ferry's shm sessions see it: hostname plus machine-id (or boot id),
    plus the network namespace. Ranks on one node share shared memory and ranks on two nodes
    never do, whatever their hostnames; and ranks in two network namespaces of one machine
    (containers, or tests/netns) cannot reach each other's abstract sockets, through which an
    shm session is joined, so they are two nodes: they meet over the net session."""
    host = socket.gethostname()
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path) as f:
                ident = f.read().strip()
            if ident:
                host = f"{host}/{ident}"
                break
        except OSError:
            continue
    try:  # "net:[4026531840]": the namespace's inode, one per namespace while it exists
        return f"{host}/{os.readlink('/proc/self/ns/net')}"
    except OSError:
        return host


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


@CheckpointEngineRegistry.register("ferry")
class FerryCheckpointEngine(CheckpointEngineWithCache):
    """verl checkpoint engine over ferry's sync sessions (see the module docstring).

    bucket_size: bytes of one ring slot (verl passes update_weights_bucket_megabytes << 20).
    is_master: the actor rank that sends. engine_kwargs: ENGINE_KWARGS (docs/verl.md).
    """

    # receive_weights yields whole (name, tensor) pairs: what verl's vLLM, SGLang and
    # TensorRT-LLM server adapters take (vLLM's and TRT-LLM's assert it).
    wire_format = "named_tensors"

    def __init__(self, bucket_size: int, is_master: bool = False, **engine_kwargs: Any) -> None:
        _warn_unknown(engine_kwargs)
        self.bucket_size = int(bucket_size)
        self.is_master = bool(is_master)
        self.slots = int(engine_kwargs.get("slots", 2))
        self.timeout_s = float(engine_kwargs.get("timeout_s", DEFAULT_TIMEOUT_S))
        self.checksums = bool(engine_kwargs.get("checksums", True))
        self.node_id = str(engine_kwargs.get("node_id") or node_identity())
        self.round_bytes = int(engine_kwargs.get("round_bytes", DEFAULT_ROUND_BYTES))
        # Per engine, not per process: "" leaves FERRY_TOKEN / FERRY_TOKEN_FILE to the C++ side.
        self.token_file = str(engine_kwargs.get("token_file") or "")
        self.cache = bool(engine_kwargs.get("cache", False))
        # Where the rollout's tensors go and the master's come from; not "cpu": the device
        # path (_device_path.py), no host copy between the device and the ring.
        self.device = str(engine_kwargs.get("device", "cpu"))
        device = device_for(self.device)  # a bad or absent device fails here, by name
        self._device_path = DevicePath(device, self.bucket_size) if device.kind != "cpu" else None
        self._interface = engine_kwargs.get("interface")
        self._port = engine_kwargs.get("port")
        self._shm_address = f"@ferry-verl-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._relay_address = f"@ferry-verl-relay-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._net_address: str | None = None
        # Master: one Sender per kind of peer; rollout: one Receiver.
        self._senders: dict[str, Sender] = {}
        self._receiver: Receiver | None = None
        # Master: its shm session's Sender, created from construction on in the background
        # (binding and backing its ring of slots x bucket_size is the first update's largest
        # cost otherwise: ~3.5 s per GiB on a VM); taken by the first _serve that needs it.
        self._early_shm = _EarlySender(self._shm_address, self._options()) if is_master else None
        self._relay: _RelayThread | None = None  # on the rank hosting its node's relay
        self._cached: dict[str, torch.Tensor] | None = None  # engine_kwargs cache: the last update
        self._staging = _Staging()  # master: where yielded tensors are copied, every update
        if is_master:  # backed now, not in the first update (~3 s per GiB on a VM)
            self._staging.back_in_background(self.round_bytes)
        # master: (name, dtype, shape) of the last update's tensors, once it succeeded with
        # unique names; the next updates stream against it (_send_streamed)
        self._manifest: list[tuple] | None = None
        self._receive_buffers = _ReceiveBuffers(self.bucket_size)  # rollout: yielded views
        self._plan: dict | None = None      # the topology the sessions were built for
        self._role = "idle"
        self._rank = -1                     # this rank's index among the rollout ranks
        # The sessions' epoch: the master's "<engine instance>/<rebuilds>", which every rank
        # of the topology joined; None before the first and after a close.
        self._epoch: str | None = None
        self._instance = uuid.uuid4().hex[:12]
        self._broken = False                # the last update failed: rebuild next time
        self._update: Update | None = None  # rollout: the last receive_weights' iterator
        self._master = ""                   # rollout: names the trainer's sending rank
        self._sending = False               # master: a send_weights is running
        self._last_step: int | None = None
        self.sessions_built = 0             # how often sessions were (re)built, for tests

    # -- verl's sequence --------------------------------------------------------------------

    def prepare(self) -> dict[str, Any]:
        """Metadata for build_topology: where this rank runs, the epoch of the sessions it
        holds and whether they are healthy, and on the master where it serves (same
        addresses every update, so sessions can persist). A receive_weights the caller never
        finished is stopped here: its round fails, naming this rank, and the sessions are
        rebuilt."""
        if self._update is not None and not self._update.done:
            self._update.stop("a new update began before the last receive_weights ended")
            self._broken = True
        self._update = None
        meta = {"host": socket.gethostname(), "node": self.node_id, "pid": os.getpid(),
                "is_master": self.is_master, "relay": self._relay_address,
                "epoch": self._epoch, "healthy": self._healthy()}
        if self.is_master:
            meta["shm"] = self._shm_address
            meta["net"] = self._net()
            meta["instance"] = self._instance
            meta["members"] = self._plan["members"] if self._plan else None
        return meta

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list], dict[str, list]]:
        """Per-rank init_process_group kwargs: rollout ranks on the master's node join its
        shm session; on every other node the first rollout rank hosts a relay, one receiver of
        the master's net session, and the node's rollout ranks (the host too) join the relay's
        shm session. Receiver ids count within each shm session. The plan's epoch is the
        master's when every rank holds healthy sessions of it for the same members, else the
        next one: then every rank rebuilds."""
        if len(metadata) != actor_wg_world_size + rollout_world_size:
            raise _error(_ferry.InvalidArgumentError,
                         f"build_topology: {len(metadata)} metadata entries for "
                         f"{actor_wg_world_size} trainer + {rollout_world_size} rollout ranks")
        trainer, rollout = metadata[:actor_wg_world_size], metadata[actor_wg_world_size:]
        masters = [m for m in trainer if m.get("is_master")]
        if len(masters) != 1:
            raise _error(_ferry.InvalidArgumentError,
                         f"build_topology: {len(masters)} trainer ranks are master; need one")
        master = masters[0]
        remote_nodes: list[str] = []  # in the order of their first rollout rank
        for m in rollout:
            if m["node"] != master["node"] and m["node"] not in remote_nodes:
                remote_nodes.append(m["node"])
        if remote_nodes and not master["net"]:
            raise _error(_ferry.InvalidArgumentError,
                         "build_topology: rollout ranks run on other nodes, but the master's "
                         f"hostname '{master.get('host')}' does not resolve to an address to serve "
                         "them on: set engine_kwargs.ferry.interface")
        relays = []
        for node in remote_nodes:
            ranks = [m for m in rollout if m["node"] == node]
            relays.append({"node": node, "local": ranks[0]["relay"], "receivers": len(ranks)})
        members = [[m["node"], m["pid"]] for m in rollout]  # lists: as Ray returns them
        plan = {"shm": master["shm"], "net": master["net"],
                "master": f"trainer master rank (pid {master['pid']} on {master.get('host')})",
                "shm_receivers": sum(m["node"] == master["node"] for m in rollout),
                "net_receivers": len(remote_nodes), "relays": relays, "members": members,
                "epoch": _next_epoch(master, rollout, members)}
        kinds, receiver_ids, relay_ids, hosts = [], [], [], []
        joined: dict[str, int] = {}  # receivers so far per node
        for m in rollout:
            local = m["node"] == master["node"]
            kinds.append("shm" if local else "relay")
            relay_ids.append(-1 if local else remote_nodes.index(m["node"]))
            receiver_ids.append(joined.get(m["node"], 0))
            hosts.append(not local and receiver_ids[-1] == 0)
            joined[m["node"]] = receiver_ids[-1] + 1
        trainer_kwargs = {"role": ["master" if m is master else "idle" for m in trainer],
                          "plan": [plan] * actor_wg_world_size}
        rollout_kwargs = {"role": ["receiver"] * rollout_world_size, "kind": kinds,
                          "receiver_id": receiver_ids, "relay_id": relay_ids,
                          "hosts_relay": hosts, "plan": [plan] * rollout_world_size,
                          "rank": list(range(rollout_world_size))}
        return trainer_kwargs, rollout_kwargs

    def init_process_group(self, role: str, plan: dict, kind: str = "", receiver_id: int = 0,
                           relay_id: int = -1, hosts_relay: bool = False,
                           rank: int = -1) -> None:
        """Joins the topology; keeps the sessions of the last update when the plan's epoch is
        the one this rank holds (build_topology decided so for every rank)."""
        self._role = role
        self._rank = rank
        if role == "idle":
            return
        if plan.get("epoch") is not None and plan.get("epoch") == self._epoch:
            return
        self._close_sessions()
        if role == "master":
            self._serve(plan)
        else:
            if hosts_relay:
                self._relay = _RelayThread(plan["net"], relay_id, plan["relays"][relay_id],
                                           self._options())
            address = plan["shm"] if kind == "shm" else plan["relays"][relay_id]["local"]
            self._join(address, receiver_id)
            if self._receiver.writable_views_error is not None:
                # No copy-on-write views of this ring: buckets are copied into the receive
                # buffers, backed now while the first update is on its way.
                self._receive_buffers.back_in_background()
        self._plan = plan
        self._epoch = plan.get("epoch")
        self._master = str(plan.get("master", ""))
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
        self._sending = True
        try:
            if self._manifest is not None and len(self._senders) == 1:
                return await self._send_streamed(weights, global_steps)
            return await self._send_staged(weights, global_steps)
        finally:
            self._sending = False

    async def _send_staged(self, weights: Iterable | AsyncIterator,
                           global_steps: int | None) -> dict[str, Any]:
        """An update through the staging buffer: the first, and any whose manifest the last
        one did not teach (see _send_streamed)."""
        loop = asyncio.get_running_loop()
        step = None if global_steps is None else int(global_steps)
        start = time.monotonic()
        total_bytes = tensors = 0
        slowest: dict[str, float] = {}
        sent = {kind: 0 for kind in self._senders}  # tensor bytes over each session's links
        args, names, held = [], set(), 0  # args: (arg, owner of its memory)
        staging = self._staging
        manifest: list[tuple] | None = []  # what the next update streams against
        manifest_names: set[str] = set()

        async def send(more_follows: bool) -> None:
            nonlocal args, names, held
            stats = await loop.run_in_executor(None, self._send_round,
                                               [a for a, _ in args], more_follows, step)
            for kind, s in stats.items():
                slowest[kind] = slowest.get(kind, 0.0) + s.seconds
                # The sender writes each segment once per joined peer (a relay per node).
                sent[kind] += held * self._senders[kind].receivers
            args, names, held = [], set(), 0
            staging.used = 0  # the round was acknowledged: its copies may be overwritten

        try:
            async for name, tensor in _items(weights):
                if name in names:  # a name twice needs two rounds
                    await send(more_follows=True)
                # A private copy at yield time (verl's generators may refill their buffer),
                # or, for a tensor the staging buffer has no room left for, none: it ends the
                # round and is sent from the caller's memory before the generator is pulled
                # again, so it is never held past a refill.
                staged = staging.copy(tensor, self.round_bytes)
                if staged is not None:
                    arg, owner = tensor_arg(name, staged)
                else:
                    arg, owner = tensor_arg(name, tensor)
                size = arg_bytes(arg)
                if manifest is not None:
                    # A name twice needs two rounds; a streamed update is one: keep staging.
                    if name in manifest_names:
                        manifest = None
                    else:
                        manifest.append((arg[0], arg[1], tuple(arg[2])))
                        manifest_names.add(name)
                args.append((arg, owner))
                names.add(name)
                held += size
                total_bytes += size
                tensors += 1
                if staged is None:
                    await send(more_follows=True)
            await send(more_follows=False)
        except BaseException:
            self._broken = True
            raise
        self._manifest = manifest
        return _metrics(total_bytes, tensors, time.monotonic() - start, slowest, sent,
                        streamed=False)

    async def _send_streamed(self, weights: Iterable | AsyncIterator,
                             global_steps: int | None) -> dict[str, Any]:
        """An update whose manifest the last one taught: one round, each yielded tensor
        pulled from the generator on the event loop's thread (where it would run anyway),
        handed to the sender's thread as the ring has room for it and copied straight into
        the ring slot before the next is pulled: one copy, no staging (on the device path,
        the sender's thread pulls each tensor through the loop and starts its copy from the
        device). A tensor that differs from the manifest (name, order, dtype, shape, missing,
        extra) fails the update naming it; the next update then rebuilds the sessions and
        relearns the manifest through staging."""
        ((kind, sender),) = self._senders.items()
        specs = list(self._manifest)
        step = None if global_steps is None else int(global_steps)
        start = time.monotonic()
        try:
            if self._device_path is None:
                stats = await sender.send_round_streamed_async(specs, weights, step=step)
            else:  # the device's copies into the ring are started by the sender's thread
                loop = asyncio.get_running_loop()
                stats = await loop.run_in_executor(None, self._device_path.send, sender, specs,
                                                   _pulled_on(loop, weights), step)
        except BaseException:
            self._broken = True
            self._manifest = None
            raise
        return _metrics(stats.bytes, len(self._manifest), time.monotonic() - start,
                        {kind: stats.seconds}, {kind: stats.bytes * sender.receivers},
                        streamed=True)

    def receive_weights(self, global_steps: int | None = None) -> Update:
        """An async iterator over (name, tensor) of one update: writable CPU views of the ring itself,
        copy-on-write (reading copies nothing; a write copies the pages written, into this
        rank only), as verl's nccl backend yields views into its double-buffered bucket.
        Where the receiver cannot give such views (a ring of one slot, a bucket size that is
        not a whole number of pages), views into one of two receive buffers of about bucket
        size that this rank reuses every update, filled by a copy from the ring.

        Lifetime (at least what verl's nccl backend gives): a tensor is valid until the caller
        has moved past every tensor of its bucket and past the first tensor of the next bucket;
        only then is its ring slot (or buffer) refilled (nccl refills already when the caller
        asks for the next bucket's first tensor). Where the next bucket completes no tensor
        (the middle of a tensor larger than a bucket), until the caller moved past every
        tensor of its bucket. Writing into it is allowed; a caller that keeps it longer
        copies it, as load_weights copies into the model. The last bucket's tensors stay valid
        until the sender's next update.

        Refuses at its first round's BEGIN, before any tensor is yielded (FailedPreconditionError
        here, and in the sender's send_weights naming this rank), an update whose step is older
        than the last one this rank received or than global_steps. With
        engine_kwargs.ferry.cache, a complete update also becomes what get_weights() yields
        (its own copy).

        Receiving starts at once, not at the first iteration. If the task that called this
        ends before the update did (the server adapter raised, or returned early), or the
        iterator is closed or dropped first, the round fails at once and the trainer's
        send_weights raises AbortedError naming this rollout rank, its pid and why (the
        adapter's exception); the next update rebuilds the sessions on every rank.
        """
        if self._receiver is None:
            raise _error(_ferry.FailedPreconditionError,
                         "receive_weights before init_process_group joined a session")
        who = f"rollout rank {self._rank} (pid {os.getpid()})"
        if self._device_path is not None:  # device tensors, the same lifetime (_device_path.py)
            self._update = self._device_path.receiving.receive(self, global_steps, who,
                                                               self._master)
            return self._update
        self._receive_buffers.reset()  # the last update's caller is done with both
        receive = functools.partial(self._receive_update, global_steps)
        self._update = Update(self, receive, "ferry-receive", who, self._master)
        return self._update

    async def get_weights(self) -> AsyncIterator:
        """verl's CheckpointEngineWithCache: yields (name, tensor) of the last complete update
        this rollout rank received, from its own host copy, without the trainer. Needs
        engine_kwargs.ferry.cache (off by default: it holds one more copy of the model); each
        tensor is a fresh copy the caller owns."""
        if not self.cache:
            raise _error(_ferry.FailedPreconditionError,
                         "get_weights: set engine_kwargs.ferry.cache=true to keep a copy of the "
                         "last update on the rollout rank")
        if self._cached is None:
            raise _error(_ferry.FailedPreconditionError,
                         "get_weights: no update was received completely yet")
        for name, tensor in list(self._cached.items()):
            yield name, tensor.clone()

    # -- sessions ---------------------------------------------------------------------------

    def close(self) -> None:
        """Ends this rank's sessions (the peers see them end)."""
        self._close_sessions()
        if self._early_shm is not None:
            self._early_shm.close()
            self._early_shm = None

    def _close_sessions(self) -> None:
        if self._device_path is not None:
            self._device_path.release()  # before the rings are unmapped
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
        if self._relay is not None:
            self._relay.close(self.timeout_s)
            self._relay = None
        self._plan = None
        self._epoch = None

    @property
    def session_ids(self) -> dict[str, int]:
        ids = {kind: s.session_id for kind, s in self._senders.items()}
        if self._receiver is not None:
            ids["receiver"] = self._receiver.session_id
        if self._relay is not None:
            ids["relay"] = self._relay.session_id
        return ids

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
                           timeout=self.timeout_s, idle_timeout=-1.0, checksums=self.checksums,
                           token_file=self.token_file)

    def _healthy(self) -> bool:
        """This rank holds sessions of an epoch, and nothing failed or is left running."""
        return (self._epoch is not None and not self._broken and not self._sending
                and self._sessions_alive())

    def _sessions_alive(self) -> bool:
        if self._relay is not None and not self._relay.alive:
            return False
        if self._receiver is not None:
            return not self._receiver.closed
        return bool(self._senders) and not any(s.closed for s in self._senders.values())

    def _serve(self, plan: dict) -> None:
        wanted = {k: plan[f"{k}_receivers"] for k in ("shm", "net") if plan[f"{k}_receivers"]}
        try:
            early, self._early_shm = self._early_shm, None
            if early is not None and "shm" in wanted and plan["shm"] == self._shm_address:
                self._senders["shm"] = early.take()
            elif early is not None:  # no rollout rank on this node: free its ring
                early.close()
            for kind in wanted:
                if kind not in self._senders:
                    self._senders[kind] = Sender(plan[kind], options=self._options())
            with ThreadPoolExecutor(len(wanted) or 1) as pool:  # both kinds join at once
                for f in [pool.submit(self._senders[k].accept, n) for k, n in wanted.items()]:
                    f.result()
        except BaseException:
            self.close()
            raise

    def _join(self, address: str, receiver_id: int) -> None:
        # The master (or this node's relay) closes its old session and serves anew meanwhile:
        # a connect that lands on the closing one is turned down or cut off, so try again
        # until the timeout, or until the relay this rank hosts failed (its error says why).
        # (The receiver's timeout is its session's too, so it is not cut into short connects.)
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self._relay is not None:
                self._relay.raise_error()
            try:
                self._receiver = Receiver(address, receiver_id,
                                          timeout=max(deadline - time.monotonic(), 0.001))
                return
            except (_ferry.IoError, _ferry.AbortedError, _ferry.NotFoundError,
                    _ferry.TimeoutError):
                if self._relay is not None:
                    self._relay.raise_error()
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _send_round(self, args: list, more_follows: bool, step: int | None) -> dict[str, Any]:
        if len(self._senders) == 1:
            kind, sender = next(iter(self._senders.items()))
            return {kind: sender._impl.send_round(args, more_follows, step)}
        with ThreadPoolExecutor(len(self._senders)) as pool:  # one copy of args feeds both
            futures = {k: pool.submit(s._impl.send_round, args, more_follows, step)
                       for k, s in self._senders.items()}
            return {k: f.result() for k, f in futures.items()}

    def _receive_update(self, required: int | None, handoff: Handoff) -> None:
        """Receiver thread: receives the update's rounds and queues ([(name, writable view)],
        release) for the consumer, which calls release() once it is done with the views'
        bucket. The views are the ring's copy-on-write views where the receiver gives them,
        queued per segment as soon as it arrived (on_ring_segment), else copies in the free
        receive buffer, queued per bucket (on_bucket). One item per segment, not per tensor:
        each item costs the consumer a hop to an executor thread."""
        receiver = self._receiver
        buffers = self._receive_buffers

        put, wait, wait_until_all_taken = handoff.put, handoff.wait, handoff.wait_until_all_taken

        def on_bucket(tensors: list, is_last: bool) -> None:
            if tensors:
                buffer, staged = buffers.fill(tensors, handoff)
                put((staged, functools.partial(buffers.release, buffer)))
            if is_last:
                # The update is acknowledged only once the caller took every tensor, so a
                # rank that dies while loading fails the sender's send_weights too.
                wait_until_all_taken()

        held: list[threading.Event] = []  # the ring bucket the caller may still be reading
        # The bucket being received, once a segment completed a tensor: its release event and
        # that event's set(), one object per bucket (the consumer compares them).
        current: list = []

        def on_ring_segment(tensors: list, bucket_ends: bool, is_last: bool,
                            round_ends: bool) -> None:
            if tensors:
                if not current:
                    released = threading.Event()
                    current.extend((released, released.set))
                put(([(name, to_torch(dtype, shape, memory))
                      for name, dtype, shape, memory in tensors], current[1]))
            if not bucket_ends:
                return  # nothing is released before the bucket's last segment
            # Returning lets ferry hand the bucket before this one back to the sender, and at
            # the round's end this one too: wait until the caller is done with it.
            if current and not round_ends:
                if held:
                    wait(held.pop())  # set once the caller moved past this bucket's first
                held.append(current[0])
            else:
                wait_until_all_taken()  # past every tensor before: nothing is held after
                held.clear()
            current.clear()

        self._require_step(receiver, required)
        if receiver.writable_views_error is None:
            receive = functools.partial(receiver._impl.receive_round_segments_writable,
                                        on_ring_segment)
        else:
            receive = functools.partial(receiver._impl.receive_round_buckets, on_bucket)
        while self._received(receive()).more_follows:
            pass

    def _require_step(self, receiver: Receiver, required: int | None) -> None:
        """Makes the receiver refuse (FailedPreconditionError at the round's BEGIN, before any
        of it is delivered; the trainer's send_weights raises it too, naming this rank) an
        update whose step is older than the last this rank received, in any session, or than
        `required`."""
        known = [v for v in (self._last_step, required) if v is not None]
        if not known:
            return
        # The receiver also refuses, by itself, a step older than the last it received in its
        # session; this carries the minimum across sessions.
        receiver.set_min_step(max(known))

    def _received(self, stats: Any) -> Any:
        """Notes a received round's step (the sender's global_steps); returns the stats."""
        if stats.step is not None:
            self._last_step = max(stats.step, self._last_step or 0)
        return stats


def _next_epoch(master: dict, rollout: list[dict], members: list) -> str:
    """The epoch every rank of the plan joins: the master's, if every rank holds healthy
    sessions of it for these members, else the master's next."""
    epoch, instance = master.get("epoch"), master.get("instance", "master")
    if (epoch is not None and master.get("healthy") and master.get("members") == members
            and all(m.get("epoch") == epoch and m.get("healthy") for m in rollout)):
        return epoch
    count = int(epoch.rsplit("/", 1)[1]) if epoch and epoch.startswith(instance + "/") else 0
    return f"{instance}/{count + 1}"


def _metrics(total_bytes: int, tensors: int, seconds: float, session_seconds: dict,
             session_bytes: dict, streamed: bool) -> dict[str, Any]:
    """send_weights' return value (docs/verl.md lists the keys)."""
    return {"ferry/bytes": total_bytes, "ferry/tensors": tensors, "ferry/seconds": seconds,
            "ferry/gbps": total_bytes / seconds / 1e9 if seconds > 0 else 0.0,
            "ferry/streamed": 1.0 if streamed else 0.0,
            **{f"ferry/{kind}_seconds": s for kind, s in session_seconds.items()},
            **{f"ferry/{kind}_bytes": b for kind, b in session_bytes.items()}}


def _pulled_on(loop: asyncio.AbstractEventLoop, weights: Iterable | AsyncIterator) -> Iterable:
    """A plain iterator, for a worker thread, over verl's sync or async generator: each
    item is pulled on the event loop (which awaits the worker meanwhile), in the thread
    the generator would run in without ferry (CUDA's current device is per thread)."""
    items = _items(weights).__aiter__()
    while True:
        try:
            yield asyncio.run_coroutine_threadsafe(items.__anext__(), loop).result()
        except StopAsyncIteration:
            return


class _Staging:
    """One host buffer of round_bytes that the master copies yielded tensors into, backed at
    once and reused by every staged round and update. A fresh tensor per yield faulted a
    model's worth of new pages in every update (measured on qwen2.5-0.5b: 5.8 s of 9.2 s per
    update on a loaded VM); a buffer of the whole model faulted it in the first one."""

    ALIGN = 64

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.used = 0  # bytes of the round being gathered
        self._backing: threading.Thread | None = None

    def back_in_background(self, capacity: int) -> None:
        """Backs the buffer in a thread now, so the first staged round need not."""
        def back() -> None:
            self.buffer = backed_buffer(capacity)
        self._backing = threading.Thread(target=back, daemon=True, name="ferry-staging")
        self._backing.start()

    def _start(self) -> int:
        return -(-self.used // self.ALIGN) * self.ALIGN

    @staticmethod
    def _stageable(tensor: Any) -> bool:
        return isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided

    def fits(self, tensor: Any, capacity: int) -> bool:
        if not self._stageable(tensor):
            return True  # copied on its own (tensor_arg), as before
        return self._start() + tensor.numel() * tensor.element_size() <= capacity

    def copy(self, tensor: Any, capacity: int) -> torch.Tensor | None:
        """A copy of `tensor` in the buffer, or None where it is no torch tensor or does not
        fit (one larger than a whole round)."""
        if not self._stageable(tensor) or not self.fits(tensor, capacity):
            return None
        if self._backing is not None:
            self._backing.join()
            self._backing = None
        if self.buffer is None or self.buffer.numel() != capacity:
            self.buffer = backed_buffer(capacity)
        start, size = self._start(), tensor.numel() * tensor.element_size()
        view = self.buffer[start:start + size].view(tensor.dtype).view(tensor.shape)
        view.copy_(tensor.detach().resolve_conj().resolve_neg())
        self.used = start + size
        return view


class _ReceiveBuffers:
    """The rollout rank's two receive buffers, reused by every bucket and update (verl's nccl
    backend: send_buf/recv_buf). The receiver thread fills one while the consumer reads the
    other; a buffer is refilled only once the consumer released it (moved past its bucket).
    Fresh memory per tensor faulted a model's worth of pages in every update (qwen2.5-0.5b:
    about 1.8 s of the rollout side's time per update on a loaded VM)."""

    ALIGN = 64

    def __init__(self, bucket_size: int) -> None:
        self.bucket_size = bucket_size
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._free = [threading.Event(), threading.Event()]
        self._next = 0
        self._backing: threading.Thread | None = None
        self.reset()

    def back_in_background(self) -> None:
        """Backs both buffers in a thread now, so a new session's first buckets need not."""
        if self._backing is None and any(b is None for b in self._buffers):
            self._backing = threading.Thread(target=self._back, daemon=True,
                                             name="ferry-receive-buffers")
            self._backing.start()

    def _back(self) -> None:
        for index, buffer in enumerate(self._buffers):
            if buffer is None:
                self._buffers[index] = backed_buffer(self.bucket_size)

    def reset(self) -> None:
        """A new update: the last update's consumer holds neither buffer any more."""
        for free in self._free:
            free.set()
        self._next = 0

    def release(self, index: int) -> None:
        self._free[index].set()

    def fill(self, tensors: list, handoff: Handoff) -> tuple[int, list]:
        """Waits for the next buffer to be released (or the caller's end to stop), copies
        `tensors` ((name, dtype, shape, memory) views into the ring) into it: (its index,
        [(name, writable view)])."""
        index = self._next
        handoff.wait(self._free[index])
        self._free[index].clear()
        self._next = 1 - index
        starts, end = [], 0
        for *_, memory in tensors:
            starts.append(-(-end // self.ALIGN) * self.ALIGN)
            end = starts[-1] + memory.nbytes
        if self._backing is not None:
            self._backing.join()
            self._backing = None
        buffer = self._buffers[index]
        if buffer is None or buffer.numel() < end:  # a tensor larger than a bucket: grows
            buffer = backed_buffer(max(end, self.bucket_size))
            self._buffers[index] = buffer
        staged = []
        for (name, dtype, shape, memory), start in zip(tensors, starts):
            view = typed(buffer[start:start + memory.nbytes], dtype, shape)
            view.copy_(to_torch(dtype, shape, memory))
            staged.append((name, view))
        return index, staged


class _EarlySender:
    """A Sender being created in a background thread (the GIL is released while its ring is
    backed), so the first update finds it ready."""

    def __init__(self, address: str, options: SyncOptions) -> None:
        self._sender: Sender | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._create, args=(address, options),
                                        name="ferry-early-sender", daemon=True)
        self._thread.start()

    def _create(self, address: str, options: SyncOptions) -> None:
        try:
            self._sender = Sender(address, options=options)
        except BaseException as e:  # raised by take()
            self._error = e

    def take(self) -> Sender:
        """The Sender, once created; raises what creating it raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sender

    def close(self) -> None:
        self._thread.join()
        if self._sender is not None:
            self._sender.close()


class _RelayThread:
    """A node's relay, run by the rank that hosts it: connects to the master's net session,
    waits for the node's rollout ranks, then forwards every round until the session ends
    (the master closed it, or a round failed: the relay names the failure both upstream and
    to its local receivers). Its error, if any, is kept for raise_error()."""

    def __init__(self, upstream: str, relay_id: int, spec: dict, options: SyncOptions) -> None:
        self._relay: Relay | None = None
        self._error: BaseException | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(upstream, relay_id, spec, options),
            name=f"ferry-relay-{relay_id}", daemon=True)
        self._thread.start()

    def _run(self, upstream: str, relay_id: int, spec: dict, options: SyncOptions) -> None:
        try:
            self._relay = Relay(upstream, relay_id, spec["local"], options=options)
            if self._stopped.is_set():
                return
            self._relay.accept(spec["receivers"])
            while True:
                self._relay.relay_round()
        except BaseException as e:  # the session ended; kept for the hosting rank
            if not self._stopped.is_set():
                self._error = e
        finally:
            if self._relay is not None:
                self._relay.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def session_id(self) -> int:
        relay = self._relay
        return relay.session_id if relay is not None and not relay.closed else 0

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self, timeout_s: float) -> None:
        """Stops the relay. Between rounds it waits on the master only, so it ends once the
        master's session does (it closes it when it serves anew); waits up to timeout_s."""
        self._stopped.set()
        relay = self._relay
        if relay is not None:
            relay.stop()
        self._thread.join(timeout_s)


__all__ = ["FerryCheckpointEngine", "ENGINE_KWARGS", "node_identity"]

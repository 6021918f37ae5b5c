"""A verl rank's ferry sessions and the topology they form (ferry.verl.checkpoint_engine's
engine is a thin layer over this): where each rank runs (node_identity), which rank serves,
relays or joins what (plan_topology, with the epoch that decides whether sessions persist),
and RankSessions, the sessions a rank holds (the master's Senders, a rollout rank's Receiver
and the relay it may host) with the rollout's receive path. Imports nothing of the engine."""

from __future__ import annotations

import functools
import os
import random
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Iterable

import torch

from .. import _ferry
from .._tensors import _error
from ..sync import MultiReceiver, Receiver, Relay, Sender, SyncOptions, send_update_async
from ._handoff import Handoff
from ._memory import backed_buffer, copied_into
from ._parts import plan_parts, sender_context, sender_count
from ._pulled import PulledUpdate, _with_context


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


def plan_topology(actor_wg_world_size: int, rollout_world_size: int,
                  metadata: list[dict]) -> tuple[dict[str, list], dict[str, list]]:
    """FerryCheckpointEngine.build_topology (see its docstring)."""
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
    tp_size = max([m.get("tp_size", 1) for m in rollout] or [1])
    if rollout_world_size % tp_size:
        raise _error(_ferry.InvalidArgumentError,
                     f"build_topology: engine_kwargs.ferry.tp_size={tp_size}, but there are "
                     f"{rollout_world_size} rollout ranks (not whole tensor-parallel groups)")
    count = sender_count(master.get("senders", 1), actor_wg_world_size)
    if count > 1:
        return plan_parts(trainer, rollout, master, count, _next_epoch)
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


def _next_epoch(master: dict, rollout: list[dict], members: list) -> str:
    """The epoch every rank of the plan joins: the master's, if every rank holds healthy
    sessions of it for these members, else the master's next."""
    epoch, instance = master.get("epoch"), master.get("instance", "master")
    if (epoch is not None and master.get("healthy") and master.get("members") == members
            and all(m.get("epoch") == epoch and m.get("healthy") for m in rollout)):
        return epoch
    count = int(epoch.rsplit("/", 1)[1]) if epoch and epoch.startswith(instance + "/") else 0
    return f"{instance}/{count + 1}"


class RankSessions:
    """The sessions one engine rank holds and how it receives over them; the engine
    (FerryCheckpointEngine) sets the attributes these methods use in its constructor."""

    async def _send_update(self, weights: Iterable | AsyncIterator,
                           global_steps: int | None) -> dict[str, Any]:
        """The master's send_weights: one call, ferry.sync.send_update_async, streamed or
        staged as the Senders decide (on the device path each tensor is copied from its
        device into the ring, _device_path.py); returns the metrics."""
        step = None if global_steps is None else int(global_steps)
        senders = list(self._senders.items())
        ends = [s for _, s in senders]
        device = self._device_path.register(ends) if self._device_path is not None else None
        start = time.monotonic()
        self._sending = True
        try:
            stats = await send_update_async(ends, weights, step=step,
                                            staging_bytes=self.round_bytes, device=device)
        except BaseException:
            self._broken = True
            raise
        finally:
            self._sending = False
        first = stats[0]
        return _metrics(first.bytes, first.tensors, time.monotonic() - start,
                        {kind: st.seconds for (kind, _), st in zip(senders, stats)},
                        {kind: st.bytes * s.receivers for (kind, s), st in zip(senders, stats)},
                        streamed=first.streamed)

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
        for relay in self._part_relays:
            relay.close(self.timeout_s)
        self._part_relays = []
        self._plan = None
        self._epoch = None

    @property
    def session_ids(self) -> dict[str, int]:
        ids = {kind: s.session_id for kind, s in self._senders.items()}
        if isinstance(self._receiver, Receiver):
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

    def _options(self, timeout: float | None = None) -> SyncOptions:
        # token_file is per engine, not per process: unset leaves FERRY_TOKEN /
        # FERRY_TOKEN_FILE to the C++ side.
        fields = {k: str(v) if k == "token_file" else v for k, v in self.sync_options.items()
                  if not (k == "token_file" and not v)}
        return SyncOptions(bucket_bytes=self.bucket_size,
                           timeout=self.timeout_s if timeout is None else timeout,
                           idle_timeout=-1.0, **fields)

    def _healthy(self) -> bool:
        """This rank holds sessions of an epoch, and nothing failed or is left running."""
        return (self._epoch is not None and not self._broken and not self._sending
                and self._sessions_alive())

    def _sessions_alive(self) -> bool:
        if self._relay is not None and not self._relay.alive:
            return False
        if any(not relay.alive for relay in self._part_relays):
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

    def _join_parts(self, plan: dict, addresses: list[str], receiver_id: int,
                    relays: list[dict]) -> None:
        """Several senders: starts the relays this rank hosts (one per sender on another
        node), then joins every sender's session with one MultiReceiver, retrying as _join
        does while a sender or relay is not serving yet."""
        self._part_relays = [_RelayThread(r["upstream"], r["relay_id"], r, self._options())
                             for r in relays or []]
        deadline = time.monotonic() + self.timeout_s
        while True:
            for relay in self._part_relays:
                relay.raise_error()
            try:
                self._receiver = MultiReceiver(
                    addresses, receiver_id,
                    options=self._options(timeout=max(deadline - time.monotonic(), 0.001)))
                break
            except (_ferry.IoError, _ferry.AbortedError, _ferry.NotFoundError,
                    _ferry.TimeoutError) as e:
                for relay in self._part_relays:
                    relay.raise_error()
                if time.monotonic() >= deadline:
                    raise _with_context(e, sender_context(e, plan)) from e
                time.sleep(0.05)
        self._receive_buffers.back_in_background()  # each tensor is copied into them

    def _local(self, tensors: list) -> list:
        """A batch as the caller gets it: (name, tensor), or with engine_kwargs.ferry.tp_size
        (name, this rank's slice, ShardSpec) (_rank_local.py), a view where it can be."""
        slicer = self._slicer
        return tensors if slicer is None else [slicer.cut(name, t) for name, t in tensors]

    def _receive_parts(self, required: int | None, handoff: Handoff) -> None:
        """Receiver thread with several senders: one whole update from every sender
        (MultiReceiver.receive_update: the step checked across every round, each tensor from
        one sender); each tensor, handed over for the length of one call, is copied into the
        free receive buffer and queued alone. An error names the trainer rank of the sender
        it names."""
        receiver, buffers = self._receiver, self._receive_buffers

        def on_tensor(name: str, tensor: torch.Tensor) -> None:
            index, staged = buffers.fill(self._local([(name, tensor)]), handoff.wait)
            handoff.put((staged, functools.partial(buffers.release, index)))

        self._require_step(receiver, required)
        try:
            self._received(receiver.receive_update(on_tensor))
        except _ferry.FerryError as e:
            if handoff.stop.is_set():
                raise
            raise _with_context(e, sender_context(e, self._plan)) from e

    def _pull_update(self, required: int | None, who: str) -> PulledUpdate:
        """One update from one sender, pulled as the caller iterates: the ring's writable
        copy-on-write views where the receiver gives them, each segment's tensors as soon as
        it arrived; else copies in the free receive buffer, a bucket at a time."""
        receiver = self._receiver
        self._require_step(receiver, required)
        if receiver.writable_views_error is None:
            return PulledUpdate(self, receiver, who, self._master, writable=True,
                                local=self._local)
        self._receive_buffers.reset()  # the last update's caller is done with both
        copies = _ReceiveBufferCopies(self._receive_buffers, self._local)
        return PulledUpdate(self, receiver, who, self._master, writable=False, copies=copies)

    def _require_step(self, receiver: Receiver | MultiReceiver, required: int | None) -> None:
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

    def fill(self, tensors: list, wait: Callable[[threading.Event], None]) -> tuple[int, list]:
        """Waits (`wait`) for the next buffer to be released, copies `tensors` ((name, tensor,
        ...) views of the ring) into it: (its index, [(name, writable view, ...)])."""
        index = self._next
        wait(self._free[index])
        self._free[index].clear()
        self._next = 1 - index
        sizes = [entry[1].numel() * entry[1].element_size() for entry in tensors]
        starts, end = [], 0
        for nbytes in sizes:
            starts.append(-(-end // self.ALIGN) * self.ALIGN)
            end = starts[-1] + nbytes
        if self._backing is not None:
            self._backing.join()
            self._backing = None
        buffer = self._buffers[index]
        if buffer is None or buffer.numel() < end:  # a tensor larger than a bucket: grows
            buffer = backed_buffer(max(end, self.bucket_size))
            self._buffers[index] = buffer
        staged = [(name, copied_into(buffer[start:start + nbytes], tensor), *rest)
                  for (name, tensor, *rest), start, nbytes in zip(tensors, starts, sizes)]
        return index, staged


def _must_be_free(event: threading.Event) -> None:
    """A pulled update reads a bucket only once the caller is done with the buffer it takes."""
    if not event.is_set():
        raise _error(_ferry.InternalError,
                     "a receive buffer was to be refilled while the caller could still read it")


class _ReceiveBufferCopies:
    """Receiver.receive_update's copies (ferry/_pull.py) into the two receive buffers: fill()
    copies a bucket (this rank's slices of it) into the free one; moved_on() frees the one the
    caller moved past."""

    def __init__(self, buffers: _ReceiveBuffers, local: Callable[[list], list]) -> None:
        self._buffers, self._local = buffers, local
        self._held: list[int] = []  # the buffers filled, oldest first

    def fill(self, tensors: list) -> list:
        index, staged = self._buffers.fill(self._local(tensors), _must_be_free)
        self._held.append(index)
        return staged

    def moved_on(self) -> None:
        while len(self._held) > 1:
            self._buffers.release(self._held.pop(0))


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


def _metrics(total_bytes: int, tensors: int, seconds: float, session_seconds: dict,
             session_bytes: dict, streamed: bool) -> dict[str, Any]:
    """send_weights' return value (docs/verl.md lists the keys)."""
    return {"ferry/bytes": total_bytes, "ferry/tensors": tensors, "ferry/seconds": seconds,
            "ferry/gbps": total_bytes / seconds / 1e9 if seconds > 0 else 0.0,
            "ferry/streamed": 1.0 if streamed else 0.0,
            **{f"ferry/{kind}_seconds": s for kind, s in session_seconds.items()},
            **{f"ferry/{kind}_bytes": b for kind, b in session_bytes.items()}}

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
ranks take part in every call and iterate their generator, sending nothing; with
engine_kwargs.ferry.senders=N (or "all") N actor ranks send, each a disjoint part of every
update, merged on every rollout rank by ferry.MultiReceiver (_parts.py). Sessions persist
across updates. Whether they do is decided once, for every rank, by build_topology from what
each rank's prepare() reports: the sessions' epoch (the master's, which names its engine
instance and counts its rebuilds) and whether they are healthy. Any failed or unfinished
update, any rank new, replaced or gone, and every rank rebuilds under a new epoch: no rank
guesses alone, so none waits for a peer that kept its old session.

The master sends every update with one call, ferry.sync.send_update_async (C++
Sender::send_update): streamed against the manifest its Senders learned from the last update,
or staged when there is none or it changed at the first tensor (on the device path a streamed
update copies from the device into the ring instead, _device_path.py). global_steps travels
in every round's BEGIN as the round's step; a receiver refuses, before any tensor of it is
delivered, an update whose step is older than the last it received or than the one it asks
for. The sessions and the topology live in _sessions.py; docs/verl.md has the engine kwargs.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
import warnings
from typing import Any, AsyncIterator, Iterable

import torch

from .. import _ferry
from .._tensors import _error
from .._verl_compat import CheckpointEngineRegistry, CheckpointEngineWithCache
from ..sync import SYNC_OPTIONS, Receiver, Sender, _each
from ._device import device_for
from ._device_path import DevicePath
from ._handoff import Update
from ._parts import Split, parse_senders, part_metrics, part_of, sender_context
from ._pulled import PulledUpdate, _with_context
from ._rank_local import WIRE_FORMAT as RANK_LOCAL_WIRE_FORMAT, LocalSlicer, parse_tp_size
from ._sessions import (_EarlySender, _ReceiveBuffers, _RelayThread, RankSessions,
                        node_identity, plan_topology)
from ._sessions import _free_port  # noqa: F401  (imported from here by tests/python/test_relay.py)

DEFAULT_TIMEOUT_S = 600.0  # verl's wait for a peer; a dead peer is seen at once anyway
# The master's staging buffer, where a staged update (the first) gathers the tensors it must
# copy: small, as each of its pages costs a fault once (a tensor that does not fit is sent
# from the caller's memory instead, so a larger buffer saves only rounds).
DEFAULT_ROUND_BYTES = 64 << 20
# SyncOptions fields the engine sets itself rather than take from engine_kwargs, and why.
ENGINE_SETS = {"bucket_bytes": "verl's bucket_size", "timeout": "timeout_s",
               "idle_timeout": "a rollout rank waits for the next update however long",
               **dict.fromkeys(("delta", "delta_snapshot_limit", "delta_threads",
                                "delta_keep_limit"),
                               "no delta rounds: the rollout's writable views take none")}
# The engine's own keys, beside SyncOptions'.
ENGINE_OWN_KWARGS = frozenset({"interface", "port", "timeout_s", "node_id", "round_bytes",
                               "cache", "device", "senders", "tp_size", "hf_config"})
# engine_kwargs.ferry.* this backend reads: every SyncOptions field (ferry.sync.SYNC_OPTIONS)
# but ENGINE_SETS, passed to its sessions as given, and its own keys. Any other is warned
# about once, by name.
ENGINE_KWARGS = frozenset(SYNC_OPTIONS).difference(ENGINE_SETS) | ENGINE_OWN_KWARGS
_warned: set[str] = set()


def _warn_unknown(kwargs: dict) -> None:
    for key in kwargs:
        if key not in ENGINE_KWARGS and key not in _warned:
            _warned.add(key)
            if key in ENGINE_SETS:
                message = (f"engine_kwargs key '{key}' is ignored: the engine sets it "
                           f"({ENGINE_SETS[key]})")
            else:
                message = f"unknown engine_kwargs key '{key}' is ignored"
            warnings.warn(f"ferry checkpoint engine: {message}", stacklevel=3)


@CheckpointEngineRegistry.register("ferry")
class FerryCheckpointEngine(RankSessions, CheckpointEngineWithCache):
    """verl checkpoint engine over ferry's sync sessions (see the module docstring).

    bucket_size: bytes of one ring slot (verl passes update_weights_bucket_megabytes << 20).
    is_master: the actor rank that sends (the first of several with engine_kwargs senders).
    engine_kwargs: ENGINE_KWARGS (docs/verl.md).
    """

    # receive_weights yields whole (name, tensor) pairs: what verl's vLLM, SGLang and
    # TensorRT-LLM server adapters take (vLLM's and TRT-LLM's assert it). With
    # engine_kwargs.ferry.tp_size > 1 an engine's is "rank_local_named_tensors" (_rank_local.py).
    wire_format = "named_tensors"

    def __init__(self, bucket_size: int, is_master: bool = False, **engine_kwargs: Any) -> None:
        _warn_unknown(engine_kwargs)
        self.bucket_size = int(bucket_size)
        self.is_master = bool(is_master)
        # The SyncOptions fields given (SYNC_OPTIONS but ENGINE_SETS), for every session.
        self.sync_options = {k: v for k, v in engine_kwargs.items()
                             if k in ENGINE_KWARGS and k not in ENGINE_OWN_KWARGS}
        self.timeout_s = float(engine_kwargs.get("timeout_s", DEFAULT_TIMEOUT_S))
        self.node_id = str(engine_kwargs.get("node_id") or node_identity())
        self.round_bytes = int(engine_kwargs.get("round_bytes", DEFAULT_ROUND_BYTES))
        self.cache = bool(engine_kwargs.get("cache", False))
        # Where the rollout's tensors go and the master's come from; not "cpu": the device
        # path (_device_path.py), no host copy between the device and the ring.
        self.device = str(engine_kwargs.get("device", "cpu"))
        device = device_for(self.device)  # a bad or absent device fails here, by name
        self._device_path = DevicePath(device, self.bucket_size) if device.kind != "cpu" else None
        # Actor ranks that send (_parts.py): 1, N or "all"; the master's setting counts.
        self.senders = parse_senders(engine_kwargs.get("senders", 1))
        if self.senders != 1 and self._device_path is not None:
            raise _error(_ferry.InvalidArgumentError,
                         f"engine_kwargs.ferry.senders={self.senders!r} with device "
                         f"'{self.device}': several senders take CPU tensors only")
        # Rank-local delivery (_rank_local.py): each rollout rank yields only its slice.
        self.tp_size = parse_tp_size(engine_kwargs.get("tp_size", 1))
        self.hf_config = engine_kwargs.get("hf_config")
        if self.tp_size > 1:
            if not self.hf_config:
                raise _error(_ferry.InvalidArgumentError,
                             f"engine_kwargs.ferry.tp_size={self.tp_size} needs "
                             "engine_kwargs.ferry.hf_config (the model's folder, config.json "
                             "or a ferry preset): the slices follow its heads and sizes")
            self.wire_format = RANK_LOCAL_WIRE_FORMAT
        self._slicer: LocalSlicer | None = None  # rollout rank, tp_size > 1
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
        self._part_relays: list[_RelayThread] = []  # several senders: its node's, one each
        self._sender_index = -1             # several senders: this actor rank's part
        self._cached: dict[str, torch.Tensor] | None = None  # engine_kwargs cache: the last update
        self._receive_buffers = _ReceiveBuffers(self.bucket_size)  # rollout: yielded views
        self._plan: dict | None = None      # the topology the sessions were built for
        self._role = "idle"
        self._rank = -1                     # this rank's index among the rollout ranks
        # The sessions' epoch: the master's "<engine instance>/<rebuilds>", which every rank
        # of the topology joined; None before the first and after a close.
        self._epoch: str | None = None
        self._instance = uuid.uuid4().hex[:12]
        self._broken = False                # the last update failed: rebuild next time
        # rollout: the last receive_weights' iterator
        self._update: Update | PulledUpdate | None = None
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
        if self.tp_size != 1:
            meta["tp_size"] = self.tp_size
        if self.senders != 1:  # any actor rank may be one of several senders
            meta["senders"] = self.senders
            meta["sender_shm"] = self._shm_address
            meta["sender_net"] = self._net()
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
        return plan_topology(actor_wg_world_size, rollout_world_size, metadata)
    def init_process_group(self, role: str, plan: dict, kind: str = "", receiver_id: int = 0,
                           relay_id: int = -1, hosts_relay: bool = False,
                           rank: int = -1, sender: int = -1, addresses: list | None = None,
                           part_relays: list | None = None) -> None:
        """Joins the topology; keeps the sessions of the last update when the plan's epoch is
        the one this rank holds (build_topology decided so for every rank). With several
        senders (plan["senders"]): `sender` is this actor rank's part, and a rollout rank
        joins `addresses` (one per sender) after starting the `part_relays` it hosts."""
        self._role = role
        self._rank = rank
        self._sender_index = sender
        # verl orders the rollout ranks replica by replica, each replica's by its rank. The
        # slicer (its config and the slices it worked out) stays while the TP rank does.
        if role != "receiver" or self.tp_size == 1:
            self._slicer = None
        elif self._slicer is None or self._slicer.tp_rank != rank % self.tp_size:
            self._slicer = LocalSlicer(self.hf_config, rank % self.tp_size, self.tp_size)
        if role == "idle":
            return
        if plan.get("epoch") is not None and plan.get("epoch") == self._epoch:
            return
        self._close_sessions()
        if "senders" in plan and role in ("master", "sender"):
            self._serve(plan["senders"][sender])
        elif role == "master":
            self._serve(plan)
        elif kind == "parts":
            self._join_parts(plan, addresses, receiver_id, part_relays)
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
        self._master = str(plan.get("master", "")) if "senders" not in plan else ""
        self._broken = False
        self.sessions_built += 1

    def finalize(self) -> None:
        """Nothing to free: the sessions stay for the next update (close() ends them)."""

    async def send_weights(self, weights: Iterable | AsyncIterator,
                           global_steps: int | None = None) -> dict[str, Any]:
        """Sends one update (master) and returns its metrics. Other actor ranks iterate the
        generator without sending (it may run collectives every rank must join), return {}."""
        if self._role in ("master", "sender") and "senders" in (self._plan or {}):
            return await self._send_part(weights, global_steps)
        if self._role != "master":
            async for _ in _each(weights):
                pass
            return {}
        return await self._send_update(weights, global_steps)

    async def _send_part(self, weights: Iterable | AsyncIterator,
                         global_steps: int | None) -> dict[str, Any]:
        """One of several senders: pulls every tensor, sends its part (_parts.py)."""
        split = Split(len(self._plan["senders"]))
        try:
            metrics = await self._send_update(part_of(weights, split, self._sender_index),
                                              global_steps)
        except _ferry.FerryError as e:  # a sender named by address: which trainer rank
            raise _with_context(e, sender_context(e, self._plan)) from e
        return part_metrics(metrics, self._sender_index, split)

    def receive_weights(self, global_steps: int | None = None) -> Update | PulledUpdate:
        """An async iterator over (name, tensor) of one update (with engine_kwargs.ferry.tp_size
        above 1, (name, this rank's slice, ShardSpec): _rank_local.py): writable CPU views of
        the ring itself, copy-on-write (reading copies nothing; a write copies the pages
        written, into this rank only), as verl's nccl backend yields views into its
        double-buffered bucket.
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

        From one sender, each segment is received as the caller iterates (ferry.sync's
        Receiver.receive_update_async), the next one while the caller reads the current one;
        from several, a thread receives from the start. If the task that called this
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
        if self._plan is not None and "senders" in self._plan:
            self._receive_buffers.reset()  # the last update's caller is done with both
            receive = functools.partial(self._receive_parts, global_steps)
            self._update = Update(self, receive, "ferry-receive", who, self._master)
        else:
            self._update = self._pull_update(global_steps, who)
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
        for name, (tensor, *rest) in list(self._cached.items()):
            yield (name, tensor.clone(), *rest)

    # -- sessions ---------------------------------------------------------------------------

    def close(self) -> None:
        """Ends this rank's sessions (the peers see them end)."""
        self._close_sessions()
        if self._early_shm is not None:
            self._early_shm.close()
            self._early_shm = None


__all__ = ["FerryCheckpointEngine", "ENGINE_KWARGS", "node_identity"]

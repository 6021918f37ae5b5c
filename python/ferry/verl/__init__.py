"""Drop-in replacements for verl's BucketedWeightSender / BucketedWeightReceiver.

Same constructors, methods, callback and tensor order as
verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py, carried by ferry's shm
sync engine instead of ZMQ + pickle + one CUDA IPC / shm buffer:

- no tensor is too large for a bucket (a large one streams through it in pieces);
- the session (socket, ring of buckets) is created once per zmq_handle and process and
  reused by every later instance with the same handle: nothing is allocated per update;
- no pickle: a typed, checksummed protocol (docs/protocol.md).

zmq_handle maps to a ferry address with ferry_address(): "ipc:///tmp/x.sock" becomes the
abstract socket "@ferry/tmp/x.sock" (no file is created). docs/verl.md has the switch.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import threading
import time
import warnings
from typing import Any, AsyncIterator, Callable, Iterable, Tuple

from .. import _ferry
from .._tensors import _error
from ..sync import Receiver, Sender
from ._memory import copied_into

try:
    import torch
except ImportError:  # pragma: no cover - verl always has torch
    torch = None  # type: ignore[assignment]

# verl waits 600 s for its peer; a dead peer is seen at once anyway (socket EOF).
DEFAULT_TIMEOUT_S = 600.0
_MAX_ADDRESS = 107  # sizeof(sockaddr_un::sun_path) - 1

NamedTensor = Tuple[str, Any]

# Keyword arguments verl's own classes take beyond ferry's: accepted and ignored. Any other
# is a typo or a newer verl's: warned about once per class and name, never silently.
VERL_KEYWORDS = frozenset({"attempt_id", "target_version"})
_warned_keywords: set[tuple[str, str]] = set()


def _ignore_keywords(cls: str, extras: dict) -> None:
    for key in extras:
        if key in VERL_KEYWORDS or (cls, key) in _warned_keywords:
            continue
        _warned_keywords.add((cls, key))
        warnings.warn(f"{cls}: unknown keyword argument '{key}' is ignored", stacklevel=3)


def ferry_address(zmq_handle: str) -> str:
    """The ferry address a verl zmq_handle maps to (deterministic, same on both sides).

    "ipc://PATH" -> "@ferry" + PATH (PATH made absolute-looking), or "@ferry-<sha256>" when
    that exceeds 107 characters. "tcp://HOST:PORT" -> "HOST:PORT": ferry's net transport
    (UCX; both sides need the same FERRY_TOKEN or FERRY_TOKEN_FILE). A handle that already is
    a ferry address ("@name" or a socket path) is used as is.
    """
    if zmq_handle.startswith("@") or zmq_handle.startswith("/"):
        return zmq_handle
    scheme, sep, rest = zmq_handle.partition("://")
    if not sep or not rest:
        raise _error(_ferry.InvalidArgumentError,
                     f"zmq_handle '{zmq_handle}': expected ipc://PATH (or a ferry address)")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host or not port.isdigit():
            raise _error(_ferry.InvalidArgumentError,
                         f"zmq_handle '{zmq_handle}': expected tcp://HOST:PORT")
        return rest
    if scheme != "ipc":
        raise _error(_ferry.UnimplementedError,
                     f"zmq_handle '{zmq_handle}': ferry.verl carries ipc:// (same node) and "
                     f"tcp:// (net transport) handles, not {scheme}://")
    address = "@ferry" + (rest if rest.startswith("/") else "/" + rest)
    if len(address) > _MAX_ADDRESS:
        address = "@ferry-" + hashlib.sha256(rest.encode()).hexdigest()[:40]
    return address


# One session per address and process, shared by every instance (verl makes a new
# sender and receiver per update).
_lock = threading.Lock()
_senders: dict[str, tuple[Sender, int]] = {}
_receivers: dict[str, Receiver] = {}
_stagings: dict[str, "_Staging"] = {}


def close_sessions() -> None:
    """Closes every cached session of this process (the peers see them end)."""
    with _lock:
        sessions = [s for s, _ in _senders.values()] + list(_receivers.values())
        _senders.clear()
        _receivers.clear()
        _stagings.clear()
    for session in sessions:
        session.close()


def _drop(cache: dict, address: str, session: Any) -> None:
    with _lock:
        entry = cache.get(address)
        if entry is session or (isinstance(entry, tuple) and entry[0] is session):
            del cache[address]
    if not session.closed:
        session.close()


class BucketedWeightSender:
    """verl's sender: async_send_weights() sends one update to the receiver of zmq_handle.

    bucket_size_mb sizes each ring slot (2 slots); any tensor fits. use_shm is accepted for
    compatibility: ferry always moves buckets through host shared memory, so every tensor is
    copied to the host once as it is yielded (as verl's sender copies into its buffer: the
    generator may reuse its memory at once). verl's extra keyword arguments (VERL_KEYWORDS)
    are accepted and ignored; any other is ignored with a warning naming it. timeout_s
    bounds how long either side waits for the other (verl's 600 s).

    The update streams: tensors are taken from the generator until they hold round_bytes
    (default: 1 GiB, or the ring, 2 x bucket_size, if larger) and sent as one round, then
    the next, so at most round_bytes plus one tensor are held (host copies of device tensors
    included), never the whole model. A tensor larger than round_bytes goes alone in its
    round. Each round boundary drains the pipeline once (bench/python_sync.py measures it),
    which is why rounds are not smaller by default.
    """

    def __init__(self, zmq_handle: str, bucket_size_mb: int = 512, use_shm: bool = False,
                 timeout_s: float = DEFAULT_TIMEOUT_S, round_bytes: int | None = None,
                 **verl_extras: Any) -> None:
        _ignore_keywords("BucketedWeightSender", verl_extras)
        self.zmq_handle = zmq_handle
        self.bucket_size_mb = bucket_size_mb
        self.bucket_size = int(bucket_size_mb) << 20
        self.round_bytes = (max(2 * self.bucket_size, 1 << 30) if round_bytes is None
                            else int(round_bytes))
        self.use_shm = use_shm
        self.timeout_s = timeout_s
        self.address = ferry_address(zmq_handle)

    def _session(self) -> Sender:
        with _lock:
            cached = _senders.get(self.address)
        if cached is not None and cached[1] == self.bucket_size and not cached[0].closed:
            return cached[0]
        if cached is not None:  # another bucket size: the ring is sized per session
            _drop(_senders, self.address, cached[0])
        sender = Sender(self.address, bucket_bytes=self.bucket_size, timeout=self.timeout_s)
        try:
            sender.accept(1)
        except BaseException:
            sender.close()
            raise
        with _lock:
            _senders[self.address] = (sender, self.bucket_size)
        return sender

    async def async_send_weights(self, weights: Iterable[NamedTensor]
                                 | AsyncIterator[NamedTensor]) -> None:
        """Sends every (name, tensor) of a generator or async iterator as one update.

        Returns after the receiver processed every bucket; raises the receiver's error
        (AbortedError naming its callback's exception) if it gave up. Each yielded tensor is
        copied before the next is pulled, so the generator may refill its buffer at once. A
        name yielded twice is sent twice, in order (the later one starts a new round), so the
        receiver ends with the last, as with verl's sender. ferry.sync.Sender.send_update
        decides how: streamed straight into the ring when the update has the last one's
        manifest, else staged in rounds of round_bytes.
        """
        loop = asyncio.get_running_loop()
        sender = await loop.run_in_executor(None, self._session)
        try:
            await sender.send_update_async(weights, staging_bytes=self.round_bytes)
        except _ferry.FerryError:
            _drop(_senders, self.address, sender)  # broken: the next call starts anew
            raise


class BucketedWeightReceiver:
    """verl's receiver: receive_weights() calls on_bucket_received(weights, is_last) per bucket.

    `weights` is a list of (name, tensor) on `device`, in the sender's order, for each bucket
    that completes at least one tensor (one that only carries pieces of a larger tensor is
    not handed over). The tensors are writable, as verl's, and valid during the callback
    only, as in verl's shm path: on a CPU device they are copy-on-write views of the ring (a
    write copies the pages written, into this process only; the ring stays read-only), or,
    where the receiver cannot give those, copies in a host buffer this process reuses for
    every bucket; on another device they are copies made by .to(device). A device this
    process cannot use fails here, not at the first bucket.
    """

    def __init__(self, zmq_handle: str, device: Any, use_shm: bool = False,
                 timeout_s: float = DEFAULT_TIMEOUT_S, **verl_extras: Any) -> None:
        _ignore_keywords("BucketedWeightReceiver", verl_extras)
        self.zmq_handle = zmq_handle
        self.device = torch.device(device) if torch is not None else device
        if self.device.type != "cpu":
            try:
                torch.empty(0, device=self.device)
            except Exception as e:  # AssertionError without CUDA, RuntimeError for an index
                raise _error(_ferry.InvalidArgumentError,
                             f"device '{device}' is not usable in this process: {e}") from None
        self.use_shm = use_shm
        self.timeout_s = timeout_s
        self.address = ferry_address(zmq_handle)

    def _session(self) -> tuple[Receiver, bool]:
        with _lock:
            cached = _receivers.get(self.address)
        if cached is not None and not cached.closed:
            return cached, False
        receiver = self._connect()
        with _lock:
            _receivers[self.address] = receiver
        return receiver, True

    def _staging(self) -> "_Staging":
        with _lock:
            return _stagings.setdefault(self.address, _Staging())

    def _connect(self) -> Receiver:
        # Right after a failed update the sender closes its old session and opens a new
        # one; a connect that lands on the closing one is turned down: try again.
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return Receiver(self.address, 0, timeout=max(deadline - time.monotonic(), 0.001))
            except (_ferry.IoError, _ferry.AbortedError, _ferry.NotFoundError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def receive_weights(self, on_bucket_received: Callable[[list[NamedTensor], bool], None]
                        ) -> None:
        """Receives one update; re-raises the callback's exception after telling the sender."""
        on_cpu = self.device.type == "cpu"
        device = self.device
        delivered = False
        staging = self._staging() if on_cpu else None

        def on_bucket(views: list, is_last: bool) -> None:
            nonlocal delivered
            delivered = True
            if not views and not is_last:
                return  # only pieces of a tensor that completes in a later bucket
            if staging is not None:
                weights = staging.copy(views)
            else:
                weights = [(name, tensor.to(device)) for name, tensor in views]
            on_bucket_received(weights, is_last)
            if not on_cpu and device.type == "cuda":
                torch.cuda.synchronize(device)

        def on_ring_bucket(views: list, is_last: bool, round_ends: bool) -> None:
            nonlocal delivered
            delivered = True
            if not views and not is_last:
                return
            on_bucket_received(views, is_last)

        while True:
            receiver, fresh = self._session()
            try:
                # One update may come as several rounds (the sender streams it).
                if on_cpu and receiver.writable_views_error is None:
                    receive = functools.partial(receiver.receive_round_buckets_writable,
                                                on_ring_bucket)
                else:
                    receive = functools.partial(receiver.receive_round_buckets, on_bucket)
                while receive().more_follows:
                    pass
                return
            except _ferry.FerryError:
                _drop(_receivers, self.address, receiver)
                # A cached session whose sender went away before this update began (the
                # trainer restarted): join the new session, nothing was delivered.
                if fresh or delivered:
                    raise
            except BaseException:
                _drop(_receivers, self.address, receiver)
                raise


class _Staging:
    """A writable host buffer for a CPU receiver's callback tensors, grown to the largest
    bucket's and reused: verl hands out writable tensors, ferry's ring is read-only."""

    _ALIGN = 64  # each tensor's offset: any dtype's view is aligned

    def __init__(self) -> None:
        self._buffer = torch.empty(0, dtype=torch.uint8)

    def copy(self, views: list[NamedTensor]) -> list[NamedTensor]:
        align = self._ALIGN
        sizes = [tensor.numel() * tensor.element_size() for _, tensor in views]
        total = sum((n + align - 1) // align * align for n in sizes)
        if self._buffer.numel() < total:
            self._buffer = torch.empty(total, dtype=torch.uint8)
        weights, offset = [], 0
        for (name, tensor), n in zip(views, sizes):
            weights.append((name, copied_into(self._buffer[offset:offset + n], tensor)))
            offset += (n + align - 1) // align * align
        return weights

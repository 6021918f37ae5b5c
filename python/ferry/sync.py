"""Weight sync: ferry::sync::Sender, Receiver and Relay (include/ferry/sync.h) for Python.

    sender = ferry.Sender("@ferry-job42", bucket_bytes=64 << 20)   # trainer
    sender.accept(1)
    sender.send_round(model.state_dict())          # or: await sender.send_round_async(...)

    receiver = ferry.Receiver("@ferry-job42", receiver_id=0)      # rollout
    receiver.receive_round_buckets(lambda weights, is_last: model.load_weights(weights))

Transfers run with the GIL released. Tensors handed to callbacks view ferry's memory
(the shared ring, or a staging copy for tensors spanning buckets) and are valid only
while the callback runs: clone what you keep. A C++ error raises the FerryError subclass
of its code with the same message; a callback's exception aborts the round (the sender
raises AbortedError naming it) and is raised again unchanged by the receiver.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Mapping, Self, Sequence

from . import _ferry
from ._pull import Pull
from ._tensors import (CONVERTERS, Weights, _error, byte_view, destination_arg, ferry_dtype,
                       host_view, tensor_arg, tensor_args)

RoundStats = _ferry.RoundStats
SyncOptions = _ferry.SyncOptions
UpdateStats = _ferry.UpdateStats

# send_update's staging buffer: a staged update's rounds hold at most this many bytes.
DEFAULT_STAGING_BYTES = 64 << 20


def _option_names(role: str) -> tuple[str, ...]:
    return tuple(name for name, of, kind, _ in _ferry.sync_option_fields()
                 if of == role and kind != "not bound")


# SyncOptions' keywords by role, from the compiled tables (include/ferry/sync_option_fields.h):
# what every end reads, what a Sender reads, what a Receiver or Relay reads.
SESSION_OPTIONS = _option_names("session")
SENDER_OPTIONS = _option_names("sender")
RECEIVER_OPTIONS = _option_names("receiver")
SYNC_OPTIONS = SESSION_OPTIONS + SENDER_OPTIONS + RECEIVER_OPTIONS


def _options(who: str, accepted: tuple[str, ...], options: SyncOptions | None,
             fields: dict[str, Any]) -> SyncOptions:
    """`options`, else a SyncOptions of `fields`, each one of `accepted` (a keyword of another
    role, or of none, raises TypeError naming it)."""
    for name in fields:
        if name not in accepted:
            role = next((r for r, names in (("session", SESSION_OPTIONS),
                                             ("sender", SENDER_OPTIONS),
                                             ("receiver", RECEIVER_OPTIONS)) if name in names),
                        None)
            why = f"a {role} option" if role else "no SyncOptions field"
            raise TypeError(f"{who}() got an unexpected keyword argument '{name}' ({why}; "
                            f"{who} takes {', '.join(accepted)})")
    if options is not None:
        if fields:
            raise TypeError(f"{who}(): give options= or keyword options "
                            f"({', '.join(fields)}), not both")
        return options
    if "idle_timeout" in fields and fields["idle_timeout"] is None:
        fields["idle_timeout"] = -1.0  # forever
    if "token_file" in fields:
        fields["token_file"] = str(fields["token_file"])  # a path
    return SyncOptions(**fields)


def _show_options(cls: Any, names: tuple[str, ...]) -> None:
    """Lists `names`, with their C++ defaults, in the signature of cls (help(), inspect),
    in place of its **fields."""
    signature = inspect.signature(cls.__init__)
    defaults = SyncOptions()
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                 default=getattr(defaults, name)) for name in names]
    cls.__init__.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]


class _Endpoint:
    """What Sender and Receiver share: a context manager over the compiled `_impl`."""

    _impl: object

    def close(self) -> None:
        self._impl.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._impl.closed

    @property
    def session_id(self) -> int:
        return self._impl.session_id


class Sender(_Endpoint):
    """Streams rounds of tensors to receivers through a shared-memory ring.

    `address` is "@name" (abstract socket), a socket file path, or "host:port" (net
    transport; `token_file` names the session secret, else FERRY_TOKEN / FERRY_TOKEN_FILE).
    Keyword arguments are SyncOptions' session and sender fields (SESSION_OPTIONS,
    SENDER_OPTIONS; times in seconds), each left out keeping its default; or give `options`.
    """

    _keywords = SESSION_OPTIONS + SENDER_OPTIONS

    def __init__(self, address: str, *, options: SyncOptions | None = None,
                 **fields: Any) -> None:
        opts = _options("Sender", self._keywords, options, fields)
        self._impl = _ferry.Sender.create(address, opts)

    def accept(self, receivers: int = 1) -> None:
        """Waits for `receivers` more receivers to join (each within the timeout)."""
        self._impl.accept(receivers)

    async def accept_async(self, receivers: int = 1) -> None:
        """accept() in a worker thread, leaving the event loop free."""
        await asyncio.get_running_loop().run_in_executor(None, self._impl.accept, receivers)

    def send_round(self, weights: Weights, more_follows: bool = False,
                   step: int | None = None) -> RoundStats:
        """Sends one round: a mapping or iterable of (name, tensor), in that order.

        Returns once every receiver acknowledged the round. The tensors must not change
        until then; non-contiguous or device tensors are copied once to host memory first.
        more_follows=True marks the round as one part of a larger update (receivers see
        it in RoundStats.more_follows, and is_last stays False for its buckets). `step`, the
        trainer's step (verl's global_steps), travels in the round's BEGIN: every receiver
        sees it as RoundStats.step (None when not given).
        """
        args, owners = tensor_args(weights)
        stats = self._impl.send_round(args, more_follows, step)
        del owners
        return stats

    def send_round_streamed(self, specs: Sequence[tuple], weights: Iterable[tuple[str, Any]],
                            more_follows: bool = False, step: int | None = None) -> RoundStats:
        """Sends one round whose manifest is known beforehand, one copy per tensor.

        specs: (name, dtype, shape) of each tensor, in order (dtype: a DType, torch dtype or
        name). `weights` yields (name, tensor) in that order; each is taken only when the
        ring has room for it and copied straight into the ring slot before the next is
        asked for, so the iterator may refill one buffer for every tensor it yields. A
        tensor that differs from its spec (name, dtype, shape), a missing one or an extra
        one raises InvalidArgumentError naming it and aborts the round, which breaks the
        session as any failed round does (accept() again). An exception the iterator raises
        aborts the round too and is raised here unchanged. Non-contiguous or device tensors
        are copied to the host first. more_follows and step as in send_round().
        """
        writer = _ferry.UpdateWriter.round(self._impl, _manifest(specs), more_follows, step)
        return _push(writer, weights)[0].last_round

    async def send_round_streamed_async(self, specs: Sequence[tuple],
                                        weights: Iterable[tuple[str, Any]] | AsyncIterator,
                                        more_follows: bool = False,
                                        step: int | None = None) -> RoundStats:
        """send_round_streamed() from a coroutine, for generators that must run on the event
        loop's thread (verl's: they may run collectives and refill one buffer per yield).

        `weights` (a sync or async iterable of (name, tensor)) is pulled on the calling
        thread; each tensor is copied into the ring in a worker thread before the next is
        pulled, so the loop is free while a tensor is copied and while the sender waits for
        a free slot or for acknowledgements. Errors as send_round_streamed(); a cancelled
        call aborts the round.
        """
        loop = asyncio.get_running_loop()
        writer = await loop.run_in_executor(None, _ferry.UpdateWriter.round, self._impl,
                                            _manifest(specs), more_follows, step)
        return (await _push_async(writer, weights))[0].last_round

    def send_update(self, weights: Iterable[tuple[str, Any]], *, step: int | None = None,
                    staging_bytes: int = DEFAULT_STAGING_BYTES,
                    device: Any = None) -> UpdateStats:
        """Sends one update, every (name, tensor) of `weights`, choosing how itself
        (include/ferry/sync.h, Sender::send_update): streamed in one round, each tensor copied
        straight into the ring as it is pulled, when its first tensor matches the first of
        update_manifest (the last update sent whole with unique names); otherwise staged:
        copied into a buffer of staging_bytes as pulled and sent in rounds of at most that
        (more_follows), learning the manifest for the next update. Either way the iterator may
        reuse a tensor's memory once the next is pulled. A tensor that differs from the
        manifest in a streamed update (name, dtype, shape, missing, extra) raises
        InvalidArgumentError naming it and aborts the round (the session breaks; the next
        update is staged); an exception of the iterator is raised here unchanged. `step`
        travels in every round's BEGIN, as in send_round(). `device`: see
        ferry.sync.send_update."""
        return send_update([self], weights, step=step, staging_bytes=staging_bytes,
                           device=device)[0]

    async def send_update_async(self, weights: Iterable | AsyncIterator, *,
                                step: int | None = None,
                                staging_bytes: int = DEFAULT_STAGING_BYTES,
                                device: Any = None) -> UpdateStats:
        """send_update() from a coroutine (see ferry.sync.send_update_async)."""
        stats = await send_update_async([self], weights, step=step, staging_bytes=staging_bytes,
                                        device=device)
        return stats[0]

    @property
    def update_manifest(self) -> list[tuple] | None:
        """(name, dtype, shape) of each tensor the next send_update streams against; None
        when it will stage."""
        return self._impl.update_manifest

    def ring_memory(self) -> tuple[int, int]:
        """The ring as (address, nbytes), to page-lock once with a device runtime (so
        send_update's device copies into it are DMA). Valid until close(); unregister it
        before."""
        return self._impl.ring_memory()

    async def send_round_async(self, weights: Weights, more_follows: bool = False,
                               step: int | None = None) -> RoundStats:
        """send_round() as an awaitable: the transfer runs in a worker thread.

        Cancelling the awaiting task does not stop a round in flight; the sender stays
        busy until it ends.
        """
        args, owners = tensor_args(weights)
        loop = asyncio.get_running_loop()
        stats = await loop.run_in_executor(None, self._impl.send_round, args, more_follows,
                                           step)
        del owners
        return stats

    def close(self) -> None:
        """Ends the session: receivers see the socket close at once."""
        self._impl.close()

    @property
    def rounds_sent(self) -> int:
        return self._impl.rounds_sent

    @property
    def receivers(self) -> int:
        return self._impl.receivers

    @property
    def address(self) -> str:
        return self._impl.address


def send_update(senders: Sequence[Sender], weights: Iterable[tuple[str, Any]], *,
                step: int | None = None, staging_bytes: int = DEFAULT_STAGING_BYTES,
                device: Any = None) -> list[UpdateStats]:
    """Sender.send_update() to several Senders at once (one per kind of peer, e.g. an shm and
    a net session) from one iterator: each tensor is pulled and copied once for all of them.
    Streamed only when every Sender's update_manifest is the same; an error breaks every
    session. One UpdateStats per Sender, in order.

    device: an object with copy_async(dst, src) and synchronize(), such as ferry.verl's
    Device. Each tensor (a torch tensor) is then copied by it from its own memory straight
    into the ring (or the staging buffer), a device-to-host DMA with no host copy between,
    and its copies are waited for once per segment, before the segment is hashed and
    published. The device must order its copies before the caller's later writes to a tensor
    it was given (ferry.verl's CudaDevice: its copy stream, which the current stream waits
    for). Page-lock the rings (Sender.ring_memory) for the copies to be DMA."""
    copies = _DeviceCopies(device) if device is not None else None
    writer = _ferry.UpdateWriter.update([s._impl for s in senders], step, staging_bytes,
                                        copies and copies.flush)
    return _push(writer, weights, copies)


async def send_update_async(senders: Sequence[Sender], weights: Iterable | AsyncIterator, *,
                            step: int | None = None, staging_bytes: int = DEFAULT_STAGING_BYTES,
                            device: Any = None) -> list[UpdateStats]:
    """send_update() from a coroutine, for generators that must run on the event loop's
    thread (verl's: they may run collectives and refill one buffer per yield). `weights` (a
    sync or async iterable) is pulled on the calling thread; each tensor is put into the
    update in a worker thread, and the next is pulled once it was copied (or, with `device`,
    once its copies were started), so the loop is free while the sender copies and waits. An
    exception of the iterator aborts the update and is raised here unchanged; a cancelled
    call aborts it too."""
    copies = _DeviceCopies(device) if device is not None else None
    writer = _ferry.UpdateWriter.update([s._impl for s in senders], step, staging_bytes,
                                        copies and copies.flush)
    return await _push_async(writer, weights, copies)


class _DeviceCopies:
    """send_update's `device`: each tensor is put as a producer that starts the device's copy
    of each piece into host memory; flush() waits for them. A tensor is kept referenced until
    a flush after its last piece, as its copies may read it until then."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self._held: list[Any] = []

    def start(self, writer: Any, name: str, tensor: Any) -> None:
        src = byte_view(tensor)
        spec = (str(name), ferry_dtype(tensor.dtype), tuple(tensor.shape))

        def produce(offset: int, address: int, nbytes: int) -> None:
            self.device.copy_async(host_view(address, nbytes), src[offset:offset + nbytes])

        self._held.append(src)
        writer.start_produce(spec, produce)

    def flush(self) -> None:
        self.device.synchronize()
        # Every copy started so far landed; the newest tensor may still have pieces to copy.
        del self._held[:-1]


def _manifest(specs: Sequence[tuple]) -> list[tuple]:
    """(name, dtype, shape) tuples as the C++ side takes a manifest."""
    return [(str(n), ferry_dtype(d), tuple(int(x) for x in shape)) for n, d, shape in specs]


def _why(error: BaseException) -> str:
    """What the receivers hear when the caller's side ended an update."""
    if isinstance(error, Exception):
        return f"the sender's weights raised {type(error).__name__}: {error}"
    return f"the send was stopped: {type(error).__name__}"


def _push(writer: Any, weights: Iterable[tuple[str, Any]],
          copies: _DeviceCopies | None = None) -> list[UpdateStats]:
    """Puts every (name, tensor) of `weights` into `writer` (an _ferry.UpdateWriter), then
    finishes it; with `copies`, each through the device. An exception of the iterator aborts
    the update and is raised unchanged."""
    try:
        for name, tensor in weights:
            if copies is not None:
                copies.start(writer, name, tensor)
                writer.wait(None)
                continue
            arg, owner = tensor_arg(name, tensor)
            writer.put(arg)
            del arg, owner  # copied: the iterator may reuse the memory
    except BaseException as e:
        writer.abort(_why(e))
        raise
    return writer.finish()


# How long the loop's thread waits for a put before it waits in an executor instead (so a
# coroutine on the same loop, e.g. a colocated receiver, runs while the sender waits for a
# slot): a tensor's copy, not a slot's. Waiting in an executor costs a thread and a wake-up
# of the loop per tensor.
_HOLD_S = 0.005


async def _push_async(writer: Any, weights: Iterable | AsyncIterator,
                      copies: _DeviceCopies | None = None) -> list[UpdateStats]:
    """_push() from a coroutine: `weights` is pulled on the loop's thread, and each tensor is
    copied by the update's own thread (start_put, or the device's copies started there)
    before the next is pulled. Anything raised on this side (the iterator, a cancellation)
    aborts the update once the put or finish in flight returned, and is raised unchanged."""
    loop = asyncio.get_running_loop()
    putting = False
    finishing: asyncio.Future | None = None
    try:
        async for name, tensor in _each(weights):
            arg = owner = None
            if copies is not None:
                copies.start(writer, name, tensor)
            else:
                arg, owner = tensor_arg(name, tensor)
                writer.start_put(arg)
            putting = True
            if not writer.wait(_HOLD_S):
                await asyncio.shield(loop.run_in_executor(None, writer.wait, None))
            putting = False
            del arg, owner  # copied: the iterator may reuse the memory
        finishing = loop.run_in_executor(None, writer.finish)
        return await asyncio.shield(finishing)
    except BaseException as e:
        try:  # the writer takes one call at a time: the one in flight ends first
            if putting:
                await loop.run_in_executor(None, writer.wait, None)
            elif finishing is not None and not finishing.done():
                await asyncio.wait([finishing])
        except Exception:
            pass  # the error raised here is e's
        writer.abort(_why(e))
        raise


async def _each(weights: Any) -> AsyncIterator:
    """The items of a sync or async iterable, as an async generator (verl gives either)."""
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


class _Receiving(_Endpoint):
    """What Receiver and MultiReceiver share: the output kind, destinations (kept alive)
    and the destination and per-tensor rounds."""

    _convert: Callable
    _destinations: dict[str, Any]

    def _set_output(self, output: str) -> None:
        if output not in CONVERTERS:
            raise _error(_ferry.InvalidArgumentError,
                         f"output '{output}': expected one of {', '.join(CONVERTERS)}")
        self._convert = CONVERTERS[output]
        self._destinations = {}

    def set_destination(self, name: str, tensor: Any, slice: Any = None) -> None:
        """Registers where tensor `name` goes in receive_round_into(), whichever sender
        sends it (a contiguous CPU tensor or writable numpy array, kept alive by this
        receiver). With `slice` (a ferry.TensorSlice of `name`, e.g. from
        ferry.vllm_tp_slices) `tensor` has the slice's local shape and takes only the
        slice's bytes: the rest of the tensor is never copied (rank-local delivery)."""
        arg, owner = destination_arg(name, tensor)
        if slice is None:
            self._impl.set_destination(arg)
        else:
            if slice.name != name:
                raise _error(_ferry.InvalidArgumentError,
                             f"destination '{name}': the slice given is of '{slice.name}'")
            self._impl.set_destination_slice(slice, arg)
        self._destinations[name] = owner

    def set_destinations(self, tensors: Mapping[str, Any],
                         slices: Sequence[Any] | None = None) -> None:
        """set_destination() for each item, e.g. a model's state_dict(); with `slices`
        (ferry.vllm_tp_slices), each tensor is its slice's local tensor
        (ferry.local_tensors)."""
        by_name = {s.name: s for s in slices} if slices is not None else {}
        for name, tensor in tensors.items():
            if slices is not None and name not in by_name:
                raise _error(_ferry.InvalidArgumentError,
                             f"destination '{name}': no slice of that name was given")
            self.set_destination(name, tensor, by_name.get(name))

    def clear_destinations(self) -> None:
        self._impl.clear_destinations()
        self._destinations.clear()

    def receive_round_into(self) -> RoundStats:
        """Receives one round straight into the registered destinations (one copy)."""
        return self._impl.receive_round_into()

    def receive_round(self, on_tensor: Callable[[str, Any], None]) -> RoundStats:
        """Receives one round, calling on_tensor(name, tensor) per tensor: in order; from
        a MultiReceiver one call at a time, in each sender's order."""
        convert = self._convert

        def call(view: tuple) -> None:
            name, dtype, shape, memory = view
            on_tensor(name, convert(dtype, shape, memory))

        return self._impl.receive_round(call)

    def close(self) -> None:
        self._impl.close()
        self._destinations.clear()


class Receiver(_Receiving):
    """Joins a Sender's session and receives its rounds.

    Connects at once, retrying within `timeout` while the sender is not up yet.
    `idle_timeout` bounds the wait for a round to begin (-1 or None: forever; a dead sender
    still ends the wait at once). `output` picks what callbacks get: "torch" (default),
    "numpy" or "memoryview"; dtypes the library lacks arrive as 1-D uint8 bytes. Other
    keyword arguments are SyncOptions' session and receiver fields (SESSION_OPTIONS,
    RECEIVER_OPTIONS); or give `options`.
    """

    _keywords = SESSION_OPTIONS + RECEIVER_OPTIONS

    def __init__(self, address: str, receiver_id: int = 0, *, session: int = 0,
                 output: str = "torch", options: SyncOptions | None = None,
                 **fields: Any) -> None:
        self._set_output(output)
        opts = _options("Receiver", self._keywords, options, fields)
        self._impl = _ferry.Receiver.connect(address, receiver_id, opts, session)

    def set_min_step(self, step: int) -> None:
        """Refuses every later round whose step (send_round's `step=`) is below `step`:
        FailedPreconditionError at its BEGIN, before any tensor is delivered, and the sender's
        round fails with it. The receiver raises this minimum by itself to each step it
        receives; rounds without a step pass."""
        self._impl.set_min_step(step)

    def receive_round_buckets(
            self, on_bucket: Callable[[list[tuple[str, Any]], bool], None]) -> RoundStats:
        """Receives one round, calling on_bucket(weights, is_last) per bucket with the
        (name, tensor) pairs that complete in it, in send order (verl's callback)."""
        convert = self._convert

        def call(views: list, is_last: bool) -> None:
            on_bucket([(name, convert(dtype, shape, memory))
                       for name, dtype, shape, memory in views], is_last)

        return self._impl.receive_round_buckets(call)

    def receive_round_buckets_writable(
            self, on_bucket: Callable[[list[tuple[str, Any]], bool, bool], None]) -> RoundStats:
        """receive_round_buckets with tensors the callback may write into, without a copy:
        copy-on-write views of the ring (a write copies the pages written, into this process
        only; the ring and the other receivers keep the sender's bytes). A bucket's tensors
        stay valid until the callback for the round's next bucket returns; on_bucket's third
        argument, round_ends, marks the round's last bucket, whose tensors are valid during
        the call only. Raises FailedPreconditionError where writable_views_error is set."""
        convert = self._convert

        def call(views: list, is_last: bool, round_ends: bool) -> None:
            on_bucket([(name, convert(dtype, shape, memory))
                       for name, dtype, shape, memory in views], is_last, round_ends)

        return self._impl.receive_round_buckets_writable(call)

    def ring_memory(self) -> tuple[int, int]:
        """The ring as (address, nbytes), mapped read-only where the sender shares it: for
        page-locking it with a device runtime once (ferry.verl's device path). Valid until
        close(); unregister it before."""
        return self._impl.ring_memory()

    def receive_round_segments_writable(
            self, on_segment: Callable[[list[tuple[str, Any]], bool, bool, bool], None]
    ) -> RoundStats:
        """receive_round_buckets_writable per segment (at most 16 MiB of a bucket): calls
        on_segment(weights, bucket_ends, is_last, round_ends) for each segment that completes a
        tensor, as soon as it arrived, and for each bucket's last segment (weights may then be
        empty). A tensor stays valid until the call for the round's next bucket's last segment
        returns; one of the round's last bucket until that bucket's last call returns."""
        convert = self._convert

        def call(views: list, bucket_ends: bool, is_last: bool, round_ends: bool) -> None:
            on_segment([(name, convert(dtype, shape, memory))
                        for name, dtype, shape, memory in views], bucket_ends, is_last,
                       round_ends)

        return self._impl.receive_round_segments_writable(call)

    def receive_update(self, *, writable: bool = False,
                       copies: Any = None) -> Iterator[tuple[str, Any]]:
        """Yields (name, tensor) of one update: every round up to the one that says no more
        follow, the caller pulling each segment (no callback, no thread of ferry's). Tensors
        view the ring (or, for one spanning buckets, its assembled copy); with `writable`,
        copy-on-write views the caller may write into (writable_views_error must be None).

        A tensor is valid until the caller moved past every tensor of its bucket and past the
        first tensor of the next bucket (with a ring of one slot: until it moved past its
        bucket's last tensor); the update's last bucket until the sender's next update. The
        sender's update completes only once the caller asked past the last tensor. Leaving
        the loop early (break, an exception, close()) aborts the round: the sender raises
        AbortedError naming why. round_stats then holds the update's last round.

        With `copies` (fill(tensors) -> tensors, moved_on(): ferry/_pull.py), each bucket is
        copied out of the ring by copies.fill() and given back at once; the caller gets the
        copies, which fill() may reuse once moved_on() was called."""
        pull = Pull(self._impl, self._convert, writable, copies)
        try:
            while (segment := pull.read()) is not None:
                for entry in segment.tensors:
                    yield entry
                if copies is not None:
                    copies.moved_on()
        finally:
            if not pull.done:
                self._impl.abort("the caller left receive_update before the update ended")

    async def receive_update_async(self, *, writable: bool = False,
                                   copies: Any = None) -> AsyncIterator[tuple[str, Any]]:
        """receive_update for asyncio: each segment is read in an executor thread, the next
        one while the caller is on the current one's tensors after the first. The same
        lifetimes; a cancelled task or a closed iterator aborts the round, as abort() does
        from any thread."""
        loop = asyncio.get_running_loop()
        pull = Pull(self._impl, self._convert, writable, copies)
        job = loop.run_in_executor(None, pull.read)
        why = "the caller closed receive_update_async before the update ended"
        try:
            while (segment := await job) is not None:
                job = None
                for i, entry in enumerate(segment.tensors):
                    if i == segment.read_ahead_after:
                        job = _read_ahead(loop, pull)
                    yield entry
                if job is None:
                    job = _read_ahead(loop, pull)
            job = None
        except asyncio.CancelledError:
            why = "the task receiving the update was cancelled before the update ended"
            raise
        finally:
            if not pull.done:
                await _abort_pull(self._impl, why, job)

    def abort(self, reason: str) -> None:
        """From any thread: breaks the session, so the round being received fails here and
        at the sender with `reason` (a receive running in another thread raises within about
        100 ms). Connect anew afterwards."""
        self._impl.abort(reason)

    @property
    def round_stats(self) -> RoundStats:
        """The RoundStats of the last round receive_update read to its end."""
        return self._impl.round_stats()

    @property
    def writable_views_error(self) -> str | None:
        """None when the writable modes can run; else why not (a ring of one
        slot, buckets not a whole number of pages, or the kernel refused the mapping)."""
        return self._impl.writable_views_error()

    @property
    def last_round(self) -> int:
        return self._impl.last_round


def _read_ahead(loop: asyncio.AbstractEventLoop, pull: Pull) -> "asyncio.Future":
    """Starts reading the next segment; the caller moved past the current one's first
    tensor (copies.moved_on() first, on the caller's thread)."""
    if pull.copies is not None:
        pull.copies.moved_on()
    return loop.run_in_executor(None, pull.read)


async def _abort_pull(impl: Any, why: str, job: "asyncio.Future | None") -> None:
    """Breaks a pulled update's session with `why`, off the event loop's thread (the abort
    waits a moment for the sender to read why), then waits for the read in flight, which the
    abort ends within about 100 ms."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, impl.abort, why)
    if job is not None:
        await asyncio.gather(job, return_exceptions=True)


class MultiReceiver(_Receiving):
    """Joins several Senders' sessions, each sending a disjoint part of the weights (trainer
    ranks that split the model with split_into_parts), and receives one round of every
    sender as one round (include/ferry/multi_receiver.h).

    A tensor two senders send in one round, or senders that disagree on the step or on
    more_follows, fail the round naming both senders; a sender that dies fails it naming its
    address, and every session is closed: connect anew. Keyword arguments are those of
    Receiver.
    """

    _keywords = SESSION_OPTIONS + RECEIVER_OPTIONS

    def __init__(self, addresses: Sequence[str], receiver_id: int = 0, *,
                 output: str = "torch", options: SyncOptions | None = None,
                 **fields: Any) -> None:
        self._set_output(output)
        opts = _options("MultiReceiver", self._keywords, options, fields)
        self._impl = _ferry.MultiReceiver.connect(list(addresses), receiver_id, opts)

    def receive_update(self, on_tensor: Callable[[str, Any], None]) -> RoundStats:
        """Receives one whole update from every sender: each sender's rounds up to the one
        that says no more follow, so senders may split an update into different numbers of
        rounds (send_update stages each part in rounds of its own). Calls on_tensor(name,
        tensor) per tensor, one call at a time, in each sender's order; the tensor is valid
        during the call only. Every round of every sender must carry the same step
        (FailedPreconditionError naming both senders: no mixing of two updates), and no
        tensor may come from two senders (InvalidArgumentError naming it and both). No
        sender's last round is acknowledged until every sender's last round ended and checked
        out here, so a sender that fails before then fails the other senders' updates too.
        The stats sum every round of every sender; sender_stats each sender's rounds."""
        convert = self._convert

        def call(view: tuple) -> None:
            name, dtype, shape, memory = view
            on_tensor(name, convert(dtype, shape, memory))

        return self._impl.receive_update(call)

    def set_min_step(self, step: int) -> None:
        """Receiver.set_min_step for every sender's session: a later round whose step is
        below `step` is refused at its BEGIN, before any tensor is delivered."""
        self._impl.set_min_step(step)

    @property
    def sender_stats(self) -> list[RoundStats]:
        """Each sender's RoundStats of the last round that succeeded, in address order."""
        return self._impl.sender_stats()

    @property
    def addresses(self) -> list[str]:
        return self._impl.addresses

    @property
    def session_id(self) -> int:
        raise AttributeError("a MultiReceiver has one session per sender (see sender_stats)")


def split_into_parts(specs: Sequence[tuple], parts: int) -> list[list[int]]:
    """Splits (name, dtype, shape) specs into `parts` disjoint parts of about equal bytes:
    each part's spec indices, in the order given. The split depends on names and sizes only,
    so every trainer rank computes the same one (rank k sends part k)."""
    return _ferry.split_into_parts([(name, ferry_dtype(dtype), tuple(shape))
                                    for name, dtype, shape in specs], parts)


class Relay(_Endpoint):
    """On a receiving node: one receiver of a net Sender ("host:port") that republishes
    every round to this node's Receivers, which connect to `local_address` ("@name") as to
    a Sender. One network copy per node however many local receivers it has.

        relay = ferry.Relay("10.0.0.1:5555", relay_id=0, local_address="@ferry-node")
        relay.accept(2)                   # this node's receivers
        while True: relay.relay_round()   # one call per round; raises when the session ends

    Relays may feed relays (a chain or tree: `ferry sync topology` says which feeds which):
    given relays_address ("host:port", port 0 picks one), a relay also serves downstream
    relays there, which pass it as their upstream; accept(n, downstream_relays=k) waits for
    them, and each segment goes on to them as soon as it arrived.

    Calls run with the GIL released. stop(), from any thread, ends a relay's waits (for local
    receivers, for its peers in a round, for the sender's next round) within about 100 ms:
    the call raises AbortedError.

    Keyword arguments are SyncOptions' session and receiver fields (SESSION_OPTIONS,
    RECEIVER_OPTIONS: `wire_protect` is also how it protects what it sends to net peers); or
    give `options`.
    """

    _keywords = SESSION_OPTIONS + RECEIVER_OPTIONS

    def __init__(self, upstream: str, relay_id: int, local_address: str, *,
                 relays_address: str = "", options: SyncOptions | None = None,
                 **fields: Any) -> None:
        opts = _options("Relay", self._keywords, options, fields)
        self._impl = _ferry.Relay.connect(upstream, relay_id, local_address, opts,
                                          relays_address)

    def accept(self, local_receivers: int = 1, downstream_relays: int = 0) -> None:
        """Waits for `local_receivers` more local receivers, then `downstream_relays` more
        relays (which needs relays_address), each within the timeout; either may be 0."""
        self._impl.accept(local_receivers, downstream_relays)

    def relay_round(self) -> RoundStats:
        """Forwards the next round whole; returns its RoundStats."""
        return self._impl.relay_round()

    def stop(self) -> None:
        """Asks a relay running in another thread to end (see the class docstring)."""
        self._impl.stop()

    @property
    def local_address(self) -> str:
        return self._impl.local_address

    @property
    def relays_address(self) -> str:
        """Where downstream relays connect; '' when this relay serves none."""
        return self._impl.relays_address


for _endpoint in (Sender, Receiver, MultiReceiver, Relay):
    _show_options(_endpoint, _endpoint._keywords)
del _endpoint

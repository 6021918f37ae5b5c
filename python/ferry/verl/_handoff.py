"""receive_weights from several senders (MultiReceiver.receive_update, which calls back from
its senders' threads): a thread receives the update's rounds from the start and queues what it
received, a tensor at a time, for the caller (a coroutine) to iterate. One sender needs none of
this: its update is pulled as the caller iterates (_pulled.py).

The thread must never block for good on a caller that went away: every wait here gives up once
the caller's end stopped, raising AbortedError with the reason, which fails the round and so
tells the senders (the trainer) at once. The caller's end stops when it closes the iterator,
when the task that called receive_weights ends before the update did (verl's
CheckpointEngineWorker.update_weights: its server adapter raised, or returned early; the
reason names the exception), when the Update is dropped unfinished, or when the engine's
next prepare() finds it unfinished.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import weakref
from typing import Any, AsyncIterator, Callable

from .. import _ferry
from .._tensors import _error
from ._pulled import _describe, _with_context

DONE = object()  # queued after the update's last item


class Stop:
    """The caller's end stopped, and why (the first reason wins)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "receive_weights was abandoned by its caller") -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


class Handoff:
    def __init__(self, items: queue.Queue, stop: Stop, who: str = "") -> None:
        self.items, self.stop, self.who = items, stop, who

    def _abandoned(self) -> BaseException:
        prefix = f"{self.who}: " if self.who else ""
        return _error(_ferry.AbortedError, prefix + self.stop.reason)

    def put(self, item: Any) -> None:
        """Queues `item` for the caller, waiting while the queue is full."""
        while not self.stop.is_set():
            try:
                self.items.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise self._abandoned()

    def wait(self, event: threading.Event) -> None:
        """Waits until the caller set `event`."""
        while not event.wait(0.1):
            if self.stop.is_set():
                raise self._abandoned()


class Update:
    """What receive_weights returns: an async iterator over the update's (name, tensor).

    Runs receive(handoff) in a thread named `thread_name` from construction on; yields the
    (name, tensor) of each batch it puts, as (tensors, release). release() is called once the
    caller moved past the first tensor of the next batch with another release (the batch's
    bucket may then be refilled). An error the thread raised marks engine._broken and is
    raised to the caller. With engine.cache, each tensor is copied before the caller may write
    into it; the copies become engine._cached once the update completed. `who` names this
    rank in the errors the sender sees ("rollout rank 1 (pid 4242)"); `sender` the trainer's
    sending rank in the errors this rank raises (its session's address alone does not say
    which process died).
    """

    def __init__(self, engine: Any, receive: Callable[[Handoff], None], thread_name: str,
                 who: str, sender: str = "") -> None:
        self._engine = engine
        self._sender = sender  # names the trainer's rank in this rank's errors
        self._items: queue.Queue = queue.Queue(maxsize=64)  # bounds what waits for the caller
        self._stop = Stop()
        self.done = False  # the caller reached the update's end (or its error)
        handoff = Handoff(self._items, self._stop, who)
        self._worker = threading.Thread(target=self._run, args=(receive, handoff),
                                        name=thread_name, daemon=True)
        self._worker.start()
        self._iterator: AsyncIterator | None = None
        try:  # the task that asked: when it ends first, its exception says why
            asyncio.current_task().add_done_callback(self._caller_ended)  # type: ignore[union-attr]
        except RuntimeError:  # no running loop: the finalizer and close() remain
            pass
        weakref.finalize(self, self._stop.set,
                         "receive_weights' iterator was dropped before the update ended")

    def _run(self, receive: Callable[[Handoff], None], handoff: Handoff) -> None:
        """Runs `receive` (the update's rounds), then queues DONE, or the error it raised for
        the caller to raise."""
        try:
            receive(handoff)
            handoff.put(DONE)
        except BaseException as e:
            self._engine._broken = True
            if self._sender and isinstance(e, _ferry.FerryError) and not self._stop.is_set():
                e = _with_context(e, f"the update's sender: {self._sender}")
            try:
                self._items.put(e, timeout=1.0)
            except queue.Full:
                pass

    def _caller_ended(self, task: "asyncio.Future[Any]") -> None:
        if not self.done:
            self.stop(_describe(task))

    def stop(self, reason: str) -> None:
        """Ends the update from the caller's side: the round fails naming `reason`."""
        self._stop.set(reason)

    def __aiter__(self) -> "Update":
        return self

    async def __anext__(self) -> tuple[str, Any]:
        if self._iterator is None:
            self._iterator = self._handed_out()
        return await self._iterator.__anext__()

    async def aclose(self) -> None:
        """Stops the update (if it has not ended) and waits for its thread."""
        self.stop("receive_weights' iterator was closed before the update ended")
        if self._iterator is not None:
            await self._iterator.aclose()
        else:
            await asyncio.get_running_loop().run_in_executor(None, self._worker.join)

    async def _handed_out(self) -> AsyncIterator:
        engine, items = self._engine, self._items
        loop = asyncio.get_running_loop()
        cache: dict | None = {} if engine.cache else None
        previous = None  # releases the bucket of the tensor yielded last
        try:
            while True:
                item = await loop.run_in_executor(None, items.get)
                if item is DONE:
                    self.done = True
                    if cache is not None:
                        engine._cached = cache
                    return
                if isinstance(item, BaseException):
                    self.done = True
                    engine._broken = True
                    raise item
                tensors, release = item
                for entry in tensors:  # (name, tensor) or (name, slice, ShardSpec)
                    if cache is not None:
                        name, tensor, *rest = entry
                        cache.pop(name, None)  # a name sent twice: the last one, at the end
                        cache[name] = (tensor.to("cpu", copy=True), *rest)
                    yield entry
                    # The caller moved past this tensor: where it was its bucket's first, the
                    # caller is done with the bucket before, whose slot or buffer may be
                    # refilled.
                    if previous is not None and previous is not release:
                        previous()
                    previous = release
        finally:
            self._stop.set("receive_weights' iterator was closed before the update ended")
            await loop.run_in_executor(None, self._worker.join)

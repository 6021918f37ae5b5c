"""receive_weights' two ends, shared by the CPU and device paths.

receive_weights runs the update's rounds in a thread that queues what it received, a batch
of tensors at a time (a segment's or a bucket's: each batch costs the caller one hop to an
executor thread), for the caller (a coroutine) to yield. The thread must never block for
good on a caller that went away (it stopped iterating): every wait here gives up once the
caller's end stopped, raising AbortedError, which fails the round and so tells the sender why.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, AsyncIterator, Callable

from .. import _ferry
from .._tensors import _error

DONE = object()  # queued after the update's last item


class EndOfUpdate:
    """Queued after an update's last tensor; set once the caller reached it."""

    def __init__(self) -> None:
        self.taken = threading.Event()


class Handoff:
    def __init__(self, items: queue.Queue, stop: threading.Event) -> None:
        self.items, self.stop = items, stop

    def _abandoned(self) -> BaseException:
        return _error(_ferry.AbortedError, "receive_weights was abandoned by its caller")

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

    def wait_until_all_taken(self) -> None:
        """Waits until the caller took everything queued so far: an update is acknowledged
        only then, so a rank that dies while loading fails the sender's send_weights too."""
        end = EndOfUpdate()
        self.put(end)
        self.wait(end.taken)

    def _run(self, receive: Callable[[], None]) -> None:
        """Runs `receive` (the update's rounds), then queues DONE, or the error it raised for
        the caller to raise."""
        try:
            receive()
            self.put(DONE)
        except BaseException as e:
            try:
                self.items.put(e, timeout=1.0)
            except queue.Full:
                pass


async def handed_out(engine: Any, receive: Callable[[Handoff], None],
                     thread_name: str) -> AsyncIterator:
    """The caller's end: runs receive(handoff) in a thread named `thread_name` and yields the
    (name, tensor) of each batch it puts, as (tensors, release). release() is called once the
    caller moved past the first tensor of the next batch with another release (the batch's
    bucket may then be refilled). An error the thread raised marks engine._broken and is
    raised here. With engine.cache, each tensor is copied before the caller may write into it;
    the copies become engine._cached once the update completed."""
    loop = asyncio.get_running_loop()
    items: queue.Queue = queue.Queue(maxsize=64)  # bounds what waits for the caller
    stop = threading.Event()
    handoff = Handoff(items, stop)
    worker = threading.Thread(target=handoff._run, args=(lambda: receive(handoff),),
                              name=thread_name, daemon=True)
    worker.start()
    cache: dict | None = {} if engine.cache else None
    previous = None  # releases the bucket of the tensor yielded last
    try:
        while True:
            item = await loop.run_in_executor(None, items.get)
            if item is DONE:
                if cache is not None:
                    engine._cached = cache
                return
            if isinstance(item, EndOfUpdate):
                item.taken.set()
                continue
            if isinstance(item, BaseException):
                engine._broken = True
                raise item
            tensors, release = item
            for name, tensor in tensors:
                if cache is not None:
                    cache.pop(name, None)  # a name sent twice: the last one, at the end
                    cache[name] = tensor.to("cpu", copy=True)
                yield name, tensor
                # The caller moved past this tensor: where it was its bucket's first, the
                # caller is done with the bucket before, whose slot or buffer may be refilled.
                if previous is not None and previous is not release:
                    previous()
                previous = release
    finally:
        stop.set()
        await loop.run_in_executor(None, worker.join)

"""The receiver thread's end of receive_weights' queue, shared by the CPU and device paths.

receive_weights runs the update's rounds in a thread that queues what it received for the
caller (a coroutine). That thread must never block for good on a caller that went away (it
stopped iterating): every wait here gives up once `stop` is set, raising AbortedError, which
fails the round and so tells the sender why.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

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

    def run(self, receive: Callable[[], None]) -> None:
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

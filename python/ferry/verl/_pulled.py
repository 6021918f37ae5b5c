"""receive_weights' iterator for one sender: ferry.sync's Receiver.receive_update_async, pulled
by the caller (no thread of ferry's), with what verl's engine adds around it.

- Each tensor as the caller gets it: (name, tensor), or with engine_kwargs.ferry.tp_size
  (name, this rank's slice, ShardSpec) (`local`; on the copying paths the copies do it, so
  only a slice is copied).
- The caller's end: when the task that called receive_weights ends before the update did
  (verl's CheckpointEngineWorker.update_weights: its server adapter raised, or returned
  early), when the iterator is closed or dropped unfinished, or when the engine's next
  prepare() finds it unfinished, the round is aborted at once from this thread
  (Receiver.abort), naming this rank and why, so the trainer's send_weights raises
  AbortedError with it instead of waiting for its timeout.
- An error marks the engine broken (the next update rebuilds the sessions on every rank) and
  names the trainer's sending rank; with engine_kwargs.ferry.cache each tensor is copied as it
  is handed out, and the copies become engine._cached once the update completed.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Callable

from .. import _ferry
from ..sync import Receiver


def _describe(task: "asyncio.Future[Any]") -> str:
    """Why the task that called receive_weights ended, for the sender's error."""
    if task.cancelled():
        return "the task that called receive_weights was cancelled before the update ended"
    error = task.exception()
    if error is not None:
        return ("the caller of receive_weights raised before the update ended: "
                f"{type(error).__name__}: {error}")
    return "the caller of receive_weights returned before the update ended"


def _with_context(error: BaseException, context: str) -> BaseException:
    """`error` again, its message followed by `context`, same class and code."""
    again = type(error)(f"{error} ({context})")
    again.code = getattr(error, "code", None)  # type: ignore[attr-defined]
    again.__cause__ = error
    return again


def _abort_if_unfinished(receiver: Receiver, state: dict, reason: str) -> None:
    if not state["done"]:
        state["done"] = True
        receiver.abort(reason)


class PulledUpdate:
    """An async iterator over one update's tensors (see the module docstring)."""

    def __init__(self, engine: Any, receiver: Receiver, who: str, sender: str = "", *,
                 writable: bool, copies: Any = None,
                 local: Callable[[list], list] | None = None) -> None:
        self._engine, self._receiver, self._who, self._sender = engine, receiver, who, sender
        self._local = local
        self._tensors = receiver.receive_update_async(writable=writable, copies=copies)
        self._cache: dict | None = {} if engine.cache else None
        self._state = {"done": False}  # shared with the finalizer, which must not hold self
        try:  # the task that asked: when it ends first, its exception says why
            asyncio.current_task().add_done_callback(self._caller_ended)  # type: ignore[union-attr]
        except RuntimeError:  # no running loop: the finalizer and close() remain
            pass
        weakref.finalize(self, _abort_if_unfinished, receiver, self._state,
                         f"{who}: receive_weights' iterator was dropped before the update ended")

    @property
    def done(self) -> bool:
        """The update ended: complete, failed or stopped."""
        return self._state["done"]

    def stop(self, reason: str) -> None:
        """Ends the update from the caller's side, from any thread: the round fails naming
        this rank and `reason`."""
        if not self.done:
            self._engine._broken = True
        _abort_if_unfinished(self._receiver, self._state, f"{self._who}: {reason}")

    def _caller_ended(self, task: "asyncio.Future[Any]") -> None:
        if not self.done:
            self.stop(_describe(task))

    def __aiter__(self) -> "PulledUpdate":
        return self

    async def __anext__(self) -> tuple:
        try:
            entry = await self._tensors.__anext__()
        except StopAsyncIteration:
            self._state["done"] = True
            self._engine._received(self._receiver.round_stats)
            if self._cache is not None:
                self._engine._cached = self._cache
            raise
        except BaseException as e:
            stopped = self.done
            self._state["done"] = True
            self._engine._broken = True
            if self._sender and isinstance(e, _ferry.FerryError) and not stopped:
                raise _with_context(e, f"the update's sender: {self._sender}") from e
            raise
        if self._local is not None:
            entry = self._local([entry])[0]
        if self._cache is not None:
            name, tensor, *rest = entry
            self._cache.pop(name, None)  # a name sent twice: the last one, at the end
            self._cache[name] = (tensor.to("cpu", copy=True), *rest)
        return entry

    async def aclose(self) -> None:
        """Stops the update (if it has not ended) and waits until its read in flight ended."""
        self.stop("receive_weights' iterator was closed before the update ended")
        await self._tensors.aclose()

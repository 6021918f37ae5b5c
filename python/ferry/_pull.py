"""One update pulled from a Receiver segment by segment (Receiver.receive_update and
receive_update_async): when a bucket's slot goes back to the sender, and how far ahead the
next segment is read.

A tensor stays valid until the caller moved past every tensor of its bucket and past the first
tensor of a later bucket's segment (or, where that segment completes no tensor, until the
caller moved past every tensor of its bucket). The next segment is read while the caller is on
the current one's tensors after the first, so receiving overlaps the caller's work; never past
a round's last segment, whose END is acknowledged only once the caller took every tensor
(a rank that fails while loading fails the sender's update too). With a ring of one slot the
sender cannot fill a bucket while another is held: each bucket goes back once the caller moved
past its last tensor, and nothing is read ahead of a bucket's end.

With `copies` (an object with fill(tensors) -> tensors and moved_on()), each bucket is read
whole and copied out of the ring by copies.fill() in the reading thread (into a device, or a
buffer of the caller's), then goes back to the sender at once; the caller gets what fill()
returned. copies.moved_on() runs on the caller's thread once the caller moved past the first
tensor of the bucket filled last, before anything more is read: from then on fill() may reuse
what the bucket before held.
"""

from __future__ import annotations

from typing import Any, Callable


class Segment:
    """One segment as the caller gets it."""

    __slots__ = ("tensors", "read_ahead_after")

    def __init__(self, tensors: list, read_ahead_after: int) -> None:
        self.tensors = tensors
        # How many of its tensors the caller must have moved past before the next segment is
        # read (0: at once).
        self.read_ahead_after = read_ahead_after


class Pull:
    """The pull's state. read() is the only call that touches the receiver; the caller runs
    it in one thread at a time (an executor thread under asyncio)."""

    def __init__(self, impl: Any, convert: Callable, writable: bool, copies: Any = None) -> None:
        self._impl, self._convert, self.copies = impl, convert, copies
        self._mode = "writable" if writable else "views"
        self._hold = impl.ring_slots > 1  # a bucket may be held while the next is read
        self._held: list[int] = []  # ended buckets whose tensors the caller may still use
        self._release: list[int] = []  # released by the next read()
        self._in_round = False
        self._more_follows = True
        self.steps: list[int] = []  # each round's step, where the sender gave one
        self.done = False  # the update's last round ended and was acknowledged

    def read(self) -> Segment | None:
        """Releases what the caller is done with, then reads the next segment, beginning the
        update's next round where one ended: None once the update's last round ended."""
        impl = self._impl
        for bucket in self._release:
            impl.release(bucket)
        self._release.clear()
        while True:
            if not self._in_round:
                if not self._more_follows:
                    self.done = True
                    return None
                _, self._more_follows, step = impl.begin_round(self._mode)
                if step is not None:
                    self.steps.append(step)
                self._in_round = True
            got = impl.next_segment() if self.copies is None else self._next_bucket()
            if got is None:
                self._in_round = False  # the END released every bucket still held
                self._held.clear()
            elif self.copies is None:
                return self._arrived(*got)
            elif got.tensors:  # else a bucket that completed no tensor: read on
                return got

    def _next_bucket(self) -> Segment | None:
        """One bucket read whole, copied out (copies.fill) and given back; None at END."""
        impl, convert, tensors = self._impl, self._convert, []
        while True:
            got = impl.next_segment()
            if got is None:
                return None
            bucket, views, bucket_ends, round_ends, _ = got
            tensors += [(name, convert(dtype, shape, memory))
                        for name, dtype, shape, memory in views]
            if bucket_ends:
                break
        copied = self.copies.fill(tensors) if tensors else []
        impl.release(bucket)
        # Not past the round's end before the caller took every tensor (the ACK waits).
        return Segment(copied, len(copied) if round_ends else min(1, len(copied)))

    def _arrived(self, bucket: int, views: list, bucket_ends: bool, round_ends: bool,
                 is_last: bool) -> Segment:
        convert = self._convert
        tensors = [(name, convert(dtype, shape, memory)) for name, dtype, shape, memory in views]
        # The caller has moved past every tensor handed out before this segment: the ended
        # buckets go back once it moved past this segment's first tensor.
        self._release.extend(self._held)
        self._held.clear()
        if bucket_ends:
            if self._hold:
                self._held.append(bucket)
            else:
                self._release.append(bucket)
        if round_ends or (bucket_ends and not self._hold):
            return Segment(tensors, len(tensors))
        return Segment(tensors, min(1, len(tensors)))

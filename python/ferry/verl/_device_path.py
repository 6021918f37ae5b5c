"""engine_kwargs.ferry.device != "cpu": device tensors move between the device and the ring
without a host copy in between (docs/verl.md, "Device tensors").

Master: ferry.sync.send_update_async(device=...) copies each yielded tensor from its device
straight into the ring slot (or, for a staged update, the staging buffer): the copies of a
segment are started, then waited for once, before the segment is hashed and published. Each
Sender's ring is page-locked once (DevicePath.register), so they are DMA.

Rollout (DeviceReceive): each bucket is copied from the ring (page-locked once, read-only) into
one of two device buffers, and its tensors are yielded as views of that buffer. The next
bucket's copy runs while the caller reads the current one; a buffer is refilled only once the
caller moved past the bucket it holds, with the lifetime receive_weights' docstring gives.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch

from .. import _ferry
from .._tensors import _error, byte_view
from ..sync import Receiver, Sender
from ._device import Device
from ._pulled import PulledUpdate

_ALIGN = 256  # device views start at offsets torch's kernels accept for every dtype


class RingRegistration:
    """A ring page-locked with a device once; undone before the ring is unmapped."""

    def __init__(self, device: Device, address: int, nbytes: int, read_only: bool) -> None:
        self.device, self.address = device, address
        self.registered = device.register_host(address, nbytes, read_only)

    def release(self) -> None:
        if self.registered:
            self.device.unregister_host(self.address)
            self.registered = False


class _Buffer:
    """One of the two device buffers: refilled only once the caller moved past its bucket."""

    def __init__(self) -> None:
        self.memory: torch.Tensor | None = None
        self.in_use = False  # holds a bucket the caller may still read
        self.fence: Any = None  # the caller's stream when it moved past the buffer's bucket


class DeviceReceive:
    """The rollout's device path; kept across updates (its buffers and the ring's
    registration stay)."""

    def __init__(self, device: Device, bucket_size: int) -> None:
        self.device, self.bucket_size = device, bucket_size
        self.buffers = [_Buffer(), _Buffer()]
        self.registration: RingRegistration | None = None
        self._registered_for: Receiver | None = None

    def register(self, receiver: Receiver) -> None:
        """Page-locks the receiver's ring (read-only) once per session."""
        if self._registered_for is receiver:
            return
        self.release()
        address, nbytes = receiver.ring_memory()
        if nbytes:
            self.registration = RingRegistration(self.device, address, nbytes, read_only=True)
        self._registered_for = receiver

    def release(self) -> None:
        """Before the receiver's ring is unmapped."""
        if self.registration is not None:
            self.registration.release()
            self.registration = None
        self._registered_for = None

    def _copy_bucket(self, buffer: _Buffer, tensors: list) -> list:
        """Starts the bucket's copies into `buffer`, waits for them; the device views."""
        offsets, end = [], 0
        sizes = [entry[1].numel() * entry[1].element_size() for entry in tensors]
        for nbytes in sizes:
            offsets.append(end)
            end += -(-nbytes // _ALIGN) * _ALIGN
        if buffer.memory is None or buffer.memory.numel() < end:
            buffer.memory = self.device.empty(max(end, self.bucket_size))
        out = []
        for (name, tensor, *rest), at, nbytes in zip(tensors, offsets, sizes):
            dst = buffer.memory[at:at + nbytes]
            if nbytes:
                self.device.copy_async(dst, byte_view(tensor))
            view = dst.view(tensor.dtype).view(tensor.shape)
            out.append((name, view.to(dst.device), *rest))  # an empty one comes on the CPU
        # The ring slot is handed back when fill() returns: the copies must be done.
        self.device.synchronize()
        return out

    def receive(self, engine: Any, global_steps: int | None, who: str,
                sender: str) -> PulledUpdate:
        """receive_weights for the device path (engine: the FerryCheckpointEngine)."""
        receiver = engine._receiver
        self.register(receiver)
        for b in self.buffers:  # the last update's caller is done with both
            b.fence = self.device.fence()
            b.in_use = False
        engine._require_step(receiver, global_steps)
        return PulledUpdate(engine, receiver, who, sender, writable=False,
                            copies=_DeviceCopies(self, engine._local))


class _DeviceCopies:
    """Receiver.receive_update's copies (ferry/_pull.py) into the two device buffers: fill()
    copies a bucket (with tp_size, only each tensor's slice crosses to the device) into the
    buffer the caller moved past, after the caller's kernels reading it (its fence), and waits
    for the copies before the ring's slot goes back; moved_on() marks the buffer before the
    current one free, fenced on the caller's thread and stream."""

    def __init__(self, receive: DeviceReceive, local: Callable[[list], list]) -> None:
        self._receive, self._local = receive, local
        self._filled = 0
        self._held: list[_Buffer] = []  # the buffers filled, oldest first

    def fill(self, tensors: list) -> list:
        receive = self._receive
        buffer = receive.buffers[self._filled % 2]
        self._filled += 1
        if buffer.in_use:
            raise _error(_ferry.InternalError,
                         "a device buffer was to be refilled while the caller could still read it")
        buffer.in_use = True
        if buffer.fence is not None:
            receive.device.copy_after(buffer.fence)
        self._held.append(buffer)
        return receive._copy_bucket(buffer, self._local(tensors))

    def moved_on(self) -> None:
        while len(self._held) > 1:
            buffer = self._held.pop(0)
            buffer.fence = self._receive.device.fence()
            buffer.in_use = False


class DevicePath:
    """What a FerryCheckpointEngine with engine_kwargs.ferry.device != "cpu" keeps: the
    device, the master's ring registrations (one per Sender) and the rollout's DeviceReceive."""

    def __init__(self, device: Device, bucket_size: int) -> None:
        self.device = device
        self.receiving = DeviceReceive(device, bucket_size)
        self._senders: dict[int, RingRegistration] = {}  # id(Sender) -> its ring's

    def register(self, senders: Iterable[Sender]) -> Device:
        """Page-locks each Sender's ring once, for send_update's device copies; the device."""
        for sender in senders:
            if id(sender) not in self._senders:
                address, nbytes = sender.ring_memory()
                self._senders[id(sender)] = RingRegistration(self.device, address, nbytes,
                                                             read_only=False)
        return self.device

    def release(self) -> None:
        """Unregisters every ring: before the sessions (and their rings) are closed."""
        for registration in self._senders.values():
            registration.release()
        self._senders.clear()
        self.receiving.release()

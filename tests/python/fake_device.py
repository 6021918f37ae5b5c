"""A fake device for ferry.verl's device path on CPU: device string "fake:N". Its tensors are
CPU tensors, but its copies land late: each runs on a worker thread, in issue order, after
`delay_s`; an event completes when the worker passes it. So a path that reads what it copied
before waiting reads the old bytes. `skip_waits` ("send" or "receive") makes wait() return at
once on that side (a path missing its waits), to show the tests would catch one. Every issue,
landing and wait is logged with its side: "receive" for a copy into the device's own memory
(empty(): the rollout's buffers), else "send"; a wait has the side of its thread's last copy."""

from __future__ import annotations

import os
import queue
import threading
import time

import torch

from ferry.verl import _device


class FakeDevice(_device.Device):
    kind = "fake"

    def __init__(self, spec: str, delay_s: float = 0.0, skip_waits: str = "") -> None:
        super().__init__("cpu")
        self.spec = spec
        self.delay_s, self.skip_waits = delay_s, skip_waits
        self.log: list[tuple] = []
        self.registered: list[tuple[int, int, bool]] = []
        self.unregistered: list[int] = []
        self._lock = threading.Lock()
        self._work: queue.Queue = queue.Queue()
        self._own: set[int] = set()  # storages empty() made
        self._sides = threading.local()  # each thread's last copy's side
        self._memory = os.open("/proc/self/mem", os.O_RDWR) if skip_waits else -1
        threading.Thread(target=self._run, daemon=True).start()

    def note(self, *entry) -> None:
        with self._lock:
            self.log.append(entry)

    def _run(self) -> None:
        while True:
            job = self._work.get()
            if isinstance(job, threading.Event):
                job.set()
                continue
            dst, src, side = job
            time.sleep(self.delay_s)
            self._land(dst, src)
            self.note("land", dst.numel(), side)

    def _land(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        nbytes = dst.numel() * dst.element_size()
        plain = (dst.is_contiguous() and src.is_contiguous()
                 and nbytes == src.numel() * src.element_size())
        if self._memory < 0 or not plain:
            dst.copy_(src)
            return
        # A path missing its waits fails its round before its copies land, and the broken
        # session unmaps its ring: through /proc/self/mem a copy to or from unmapped memory
        # fails (EIO) instead of crashing the test process. (A ring mapped at the same address
        # since gets late bytes: only a round these tests expect to be wrong anyway.)
        try:
            os.pwrite(self._memory, os.pread(self._memory, nbytes, src.data_ptr()),
                      dst.data_ptr())
        except OSError:
            pass

    def empty(self, nbytes: int) -> torch.Tensor:
        memory = super().empty(nbytes)
        self._own.add(memory.untyped_storage().data_ptr())
        return memory

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        side = "receive" if dst.untyped_storage().data_ptr() in self._own else "send"
        self._sides.last = side
        self.note("issue", dst.numel(), side)
        self._work.put((dst, src, side))

    def record(self) -> threading.Event:
        event = threading.Event()
        self._work.put(event)
        return event

    def wait(self, event: threading.Event) -> None:
        side = getattr(self._sides, "last", "send")
        self.note("wait", side)
        if self.skip_waits != side:
            event.wait()

    def drain(self) -> None:
        """Waits for every copy issued (with skip_waits some are still queued: they must land
        before the ring they read or write is unmapped)."""
        self.record().wait()

    def register_host(self, address: int, nbytes: int, read_only: bool) -> bool:
        self.registered.append((address, nbytes, read_only))
        return True

    def unregister_host(self, address: int) -> None:
        self.unregistered.append(address)


_current: dict[str, FakeDevice] = {}


def use(delay_s: float = 0.0, skip_waits: str = "") -> FakeDevice:
    """Makes "fake:N" give one new FakeDevice (returned, to read its log)."""
    device = FakeDevice("fake:0", delay_s, skip_waits)
    _current["device"] = device
    _device.register_kind("fake", lambda spec, index: _current["device"])
    return device

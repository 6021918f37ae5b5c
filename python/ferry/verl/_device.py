"""The device runtime behind engine_kwargs.ferry.device: the few calls the device path needs
(asynchronous copies, events, page-locking host memory, device buffers), chosen by a torch
device string ("cpu", "cuda:N", "npu:N").

CPU copies synchronously and is what CI runs. CUDA copies on a dedicated stream, so the copies
of the next bucket overlap the caller's work on the current one; torch_npu's NPU mirrors it
(untested: no NPU was at hand). Tests register a fake kind (register_kind) whose copies land
later, on a worker thread, so a missing wait shows as wrong bytes.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable

import torch

from .. import _ferry
from .._tensors import _error


class Device:
    """Synchronous CPU copies: the default, and the base of the others."""

    kind = "cpu"  # not "cpu": the engine takes the device path

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.torch_device = torch.device(spec)

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Starts dst.copy_(src) (bytes, same size); it is done once an event recorded
        after it completed."""
        dst.copy_(src)

    def record(self) -> Any:
        """An event that completes when the copies started before it have."""
        return None

    def wait(self, event: Any) -> None:
        """Blocks until `event` completed."""

    def synchronize(self) -> None:
        """Blocks until every copy started so far completed."""
        self.wait(self.record())

    def fence(self) -> Any:
        """Marks the work queued so far on the calling thread's current stream (a caller still
        reading a buffer); copies started after copy_after(fence) wait for it."""
        return None

    def copy_after(self, fence: Any) -> None:
        """The next copies start only after `fence`'s work."""

    def empty(self, nbytes: int) -> torch.Tensor:
        """A device buffer of `nbytes` bytes (uint8)."""
        return torch.empty(nbytes, dtype=torch.uint8, device=self.torch_device)

    def register_host(self, address: int, nbytes: int, read_only: bool) -> bool:
        """Page-locks host memory so copies to and from it are DMA; False where it is not
        (then copies stay pageable, slower but right)."""
        return False

    def unregister_host(self, address: int) -> None:
        """Undoes register_host; before the memory is unmapped."""


class CudaDevice(Device):
    """CUDA through torch: copies on one dedicated stream, host memory registered with
    cudaHostRegister (read-only memory, the receiver's ring, with cudaHostRegisterReadOnly)."""

    kind = "cuda"
    _PORTABLE, _READ_ONLY = 0x01, 0x08  # cudaHostRegisterPortable, cudaHostRegisterReadOnly

    def __init__(self, spec: str) -> None:
        super().__init__(spec)
        self.stream = torch.cuda.Stream(device=self.torch_device)

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.device.type == "cpu" and src.device.type == "cpu":
            dst.copy_(src)  # host to host (a CPU tensor yielded)
            return
        # Ordered after the caller's work on its stream (src may still be written there, dst
        # still read), and the caller's later work after the copy (a generator that refills
        # the tensor it yielded, a loader that writes the buffer it was given).
        current = torch.cuda.current_stream(self.torch_device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        current.wait_stream(self.stream)

    def record(self) -> Any:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event: Any) -> None:
        event.synchronize()

    def fence(self) -> Any:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.torch_device))
        return event

    def copy_after(self, fence: Any) -> None:
        self.stream.wait_event(fence)

    def register_host(self, address: int, nbytes: int, read_only: bool) -> bool:
        flags = self._PORTABLE | (self._READ_ONLY if read_only else 0)
        err = torch.cuda.cudart().cudaHostRegister(address, nbytes, flags)
        return _registered(err, self.spec)

    def unregister_host(self, address: int) -> None:
        torch.cuda.cudart().cudaHostUnregister(address)


class NpuDevice(CudaDevice):
    """Ascend NPUs through torch_npu, which mirrors torch.cuda (streams, events). Untested:
    no NPU was at hand; host registration is left to torch_npu's pinned copies (False)."""

    kind = "npu"

    def __init__(self, spec: str) -> None:
        import torch_npu  # noqa: F401  (registers torch.npu)
        Device.__init__(self, spec)
        self.stream = torch.npu.Stream(device=self.torch_device)

    def copy_async(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.device.type == "cpu" and src.device.type == "cpu":
            dst.copy_(src)
            return
        current = torch.npu.current_stream(self.torch_device)
        self.stream.wait_stream(current)
        with torch.npu.stream(self.stream):
            dst.copy_(src, non_blocking=True)
        current.wait_stream(self.stream)

    def record(self) -> Any:
        event = torch.npu.Event()
        event.record(self.stream)
        return event

    def fence(self) -> Any:
        event = torch.npu.Event()
        event.record(torch.npu.current_stream(self.torch_device))
        return event

    def register_host(self, address: int, nbytes: int, read_only: bool) -> bool:
        return False

    def unregister_host(self, address: int) -> None:
        pass


_warned_unregistered = False


def _registered(err: Any, spec: str) -> bool:
    global _warned_unregistered
    code = int(getattr(err, "value", err))
    if code == 0:
        return True
    if not _warned_unregistered:
        _warned_unregistered = True
        warnings.warn(f"ferry device path: could not page-lock the ring for {spec} (CUDA error "
                      f"{code}); its copies stay pageable (slower)", stacklevel=3)
    return False


def _check_cuda(spec: str, index: int) -> None:
    if not torch.cuda.is_available():
        raise _error(_ferry.InvalidArgumentError,
                     f"engine_kwargs.ferry.device '{spec}': torch sees no CUDA device here")
    if index >= torch.cuda.device_count():
        raise _error(_ferry.InvalidArgumentError,
                     f"engine_kwargs.ferry.device '{spec}': only {torch.cuda.device_count()} "
                     "CUDA devices here")


def _cuda(spec: str, index: int) -> Device:
    _check_cuda(spec, index)
    return CudaDevice(f"cuda:{index}")


def _npu(spec: str, index: int) -> Device:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        raise _error(_ferry.InvalidArgumentError,
                     f"engine_kwargs.ferry.device '{spec}': torch_npu is not importable "
                     "here") from None
    return NpuDevice(f"npu:{index}")


_KINDS: dict[str, Callable[[str, int], Device]] = {
    "cpu": lambda spec, index: Device("cpu"), "cuda": _cuda, "npu": _npu}


def register_kind(kind: str, factory: Callable[[str, int], Device]) -> None:
    """Makes device strings `kind[:N]` give factory(spec, N) (tests' fake device)."""
    _KINDS[kind] = factory


def device_for(spec: str) -> Device:
    """The Device for a torch device string: "cpu", "cuda", "cuda:N", "npu:N"."""
    match = re.fullmatch(r"([a-z_]+)(?::(\d+))?", str(spec).strip())
    if match is None or match.group(1) not in _KINDS:
        raise _error(_ferry.InvalidArgumentError,
                     f"engine_kwargs.ferry.device '{spec}': not a device string ferry knows "
                     f"({', '.join(sorted(_KINDS))}, with ':N')")
    return _KINDS[match.group(1)](str(spec), int(match.group(2) or 0))

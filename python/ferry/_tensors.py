"""Tensor <-> ferry conversions: torch tensors, numpy arrays and raw buffers.

Outgoing tensors are passed to C++ by address (zero-copy) when they are contiguous host
memory; a non-contiguous or device tensor is copied once into a contiguous host tensor.
Incoming views become torch tensors (or numpy arrays) over ferry's memory without a copy.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any, Iterable, Mapping, Tuple, Union

from . import _ferry
from ._ferry import DType

try:
    import torch
except ImportError:  # numpy-only use still works
    torch = None  # type: ignore[assignment]

try:
    import numpy as np
except ImportError:
    np = None  # type: ignore[assignment]

# (name, dtype, shape, address, nbytes), as _ferry.Sender.send_round takes it.
TensorArg = Tuple[str, DType, Tuple[int, ...], int, int]
Weights = Union[Mapping[str, Any], Iterable[Tuple[str, Any]]]


def _error(cls: type, message: str) -> Exception:
    """A ferry exception raised from Python, with the same `code` C++ ones carry."""
    error = cls(message)
    names = {
        _ferry.InvalidArgumentError: "invalid_argument",
        _ferry.UnimplementedError: "unimplemented",
        _ferry.FailedPreconditionError: "failed_precondition",
    }
    error.code = names.get(cls, "internal")
    return error


def _torch_tables() -> tuple[dict, dict]:
    to_ferry, from_ferry = {}, {}
    if torch is None:
        return to_ferry, from_ferry
    for dtype in DType.__members__.values():
        attr = dtype.torch_name.removeprefix("torch.")
        # F4's torch dtype packs two values per element: shapes differ, so raw bytes instead.
        if not attr or dtype == DType.F4:
            continue
        torch_dtype = getattr(torch, attr, None)
        if isinstance(torch_dtype, torch.dtype):
            to_ferry[torch_dtype] = dtype
            from_ferry[dtype] = torch_dtype
    return to_ferry, from_ferry


_TORCH_TO_FERRY, _FERRY_TO_TORCH = _torch_tables()
_NUMPY_NAMES = {
    "bool": DType.BOOL, "uint8": DType.U8, "int8": DType.I8, "uint16": DType.U16,
    "int16": DType.I16, "float16": DType.F16, "uint32": DType.U32, "int32": DType.I32,
    "float32": DType.F32, "float64": DType.F64, "uint64": DType.U64, "int64": DType.I64,
    "complex64": DType.C64,
}
_FERRY_TO_NUMPY = {v: k for k, v in _NUMPY_NAMES.items()}


def ferry_dtype(dtype: Any) -> DType:
    """The DType of a torch dtype, numpy dtype or name ('bf16', 'torch.float32', ...)."""
    if isinstance(dtype, DType):
        return dtype
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype not in _TORCH_TO_FERRY:
            raise _error(_ferry.InvalidArgumentError,
                         f"ferry has no dtype for {dtype}: the wire carries the safetensors "
                         f"dtypes ({', '.join(DType.__members__)})")
        return _TORCH_TO_FERRY[dtype]
    if np is not None and isinstance(dtype, np.dtype):
        if dtype.name not in _NUMPY_NAMES:
            raise _error(_ferry.InvalidArgumentError, f"ferry has no dtype for numpy {dtype}")
        return _NUMPY_NAMES[dtype.name]
    return _ferry.parse_dtype(str(dtype))


def torch_dtype(dtype: DType) -> "torch.dtype | None":
    """The torch dtype of a DType, or None where this torch has none (delivered as raw bytes)."""
    return _FERRY_TO_TORCH.get(dtype)


def tensor_arg(name: str, tensor: Any, copy: bool = False) -> tuple[TensorArg | tuple, Any]:
    """The C++ argument for one outgoing tensor, and the object that owns its memory.

    The owner must stay alive (and unmodified) until the transfer returns. copy=True takes a
    private host copy even of contiguous host memory, so the caller may reuse it at once.
    """
    if torch is not None and isinstance(tensor, torch.Tensor):
        t = tensor.detach()
        if t.layout != torch.strided:
            raise _error(_ferry.InvalidArgumentError,
                         f"tensor '{name}': {t.layout} tensors are not supported; send a "
                         "dense tensor")
        dtype = ferry_dtype(t.dtype)
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        if copy or t.device.type != "cpu" or not t.is_contiguous():
            host = torch.empty(t.shape, dtype=t.dtype, device="cpu")
            host.copy_(t)  # one copy: gathers strides and crosses from the device at once
            t = host
        return (name, dtype, tuple(t.shape), t.data_ptr(), t.numel() * t.element_size()), t
    if np is not None and isinstance(tensor, np.ndarray):
        dtype = ferry_dtype(tensor.dtype)
        if copy:
            a = np.array(tensor, order="C")
        else:
            a = tensor if tensor.flags.c_contiguous else np.ascontiguousarray(tensor)
        return (name, dtype, a.shape, a.__array_interface__["data"][0], a.nbytes), a
    try:
        view = memoryview(tensor)
    except TypeError:
        raise _error(_ferry.InvalidArgumentError,
                     f"tensor '{name}': expected a torch tensor, numpy array or buffer, got "
                     f"{type(tensor).__name__}") from None
    if copy:
        view = memoryview(bytearray(view))
    return (name, DType.U8, (view.nbytes,), view.cast("B") if view.ndim != 1 else view), view


def arg_bytes(arg: TensorArg | tuple) -> int:
    """The byte size of one tensor_arg() result (a raw buffer's shape is its size)."""
    return arg[4] if len(arg) == 5 else arg[2][0]


def tensor_args(weights: Weights) -> tuple[list, list]:
    """tensor_arg() for every (name, tensor) of a mapping or iterable."""
    items = weights.items() if isinstance(weights, Mapping) else weights
    args, owners = [], []
    for name, tensor in items:
        arg, owner = tensor_arg(name, tensor)
        args.append(arg)
        owners.append(owner)
    return args, owners


def destination_arg(name: str, tensor: Any) -> tuple[TensorArg, Any]:
    """The C++ argument for a destination the receiver writes into (no copy is allowed)."""
    if torch is not None and isinstance(tensor, torch.Tensor):
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise _error(_ferry.InvalidArgumentError,
                         f"destination '{name}': must be a contiguous CPU tensor (got "
                         f"device {tensor.device}, contiguous={tensor.is_contiguous()})")
        return (name, ferry_dtype(tensor.dtype), tuple(tensor.shape), tensor.data_ptr(),
                tensor.numel() * tensor.element_size()), tensor
    if np is not None and isinstance(tensor, np.ndarray):
        if not tensor.flags.c_contiguous or not tensor.flags.writeable:
            raise _error(_ferry.InvalidArgumentError,
                         f"destination '{name}': must be a writable C-contiguous array")
        return (name, ferry_dtype(tensor.dtype), tensor.shape,
                tensor.__array_interface__["data"][0], tensor.nbytes), tensor
    raise _error(_ferry.InvalidArgumentError,
                 f"destination '{name}': expected a torch tensor or numpy array, got "
                 f"{type(tensor).__name__}")


_warned = False


def _frombuffer(memory: memoryview) -> "torch.Tensor":
    global _warned
    if not _warned:
        # torch warns once per process that the buffer is read-only; the views are read-only
        # on purpose (docs/python.md), so that one warning is noise.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            _warned = True
            return torch.frombuffer(memory, dtype=torch.uint8)
    return torch.frombuffer(memory, dtype=torch.uint8)


def byte_view(tensor: "torch.Tensor") -> "torch.Tensor":
    """The tensor's bytes as a 1-D uint8 tensor on its device (contiguous: a copy otherwise)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=tensor.device)
    return flat.view(torch.uint8)


def host_view(address: int, nbytes: int) -> "torch.Tensor":
    """A uint8 CPU tensor over host memory [address, +nbytes) that someone else owns."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    buffer = (ctypes.c_ubyte * nbytes).from_address(address)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about non-writable buffers
        return torch.frombuffer(buffer, dtype=torch.uint8)


def typed(raw: "torch.Tensor", dtype: DType, shape: tuple) -> "torch.Tensor":
    """`raw` (1-D uint8, its offset aligned to the element size) as `dtype` and `shape`.
    Dtypes torch lacks stay 1-D uint8 bytes."""
    target = _FERRY_TO_TORCH.get(dtype)
    if raw.numel() == 0:
        return torch.empty(shape if target is not None else (0,), dtype=target or torch.uint8)
    if target is None:
        return raw
    return raw.view(target).view(shape)


def to_torch(dtype: DType, shape: tuple, memory: memoryview) -> "torch.Tensor":
    """A torch tensor viewing `memory` (no copy). Dtypes torch lacks come as 1-D uint8 bytes.

    torch has no read-only tensors: writing into one that views the ring (mapped read-only)
    is SIGSEGV. Callers that may write use Receiver.receive_round_buckets_writable (its
    copy-on-write views, as ferry.verl's receivers do) or take copies."""
    if memory.nbytes == 0:
        return typed(torch.empty(0, dtype=torch.uint8), dtype, shape)
    return typed(_frombuffer(memory), dtype, shape)


def to_numpy(dtype: DType, shape: tuple, memory: memoryview) -> "np.ndarray":
    """A read-only numpy array viewing `memory`. Dtypes numpy lacks (bf16, fp8...) come as bytes."""
    name = _FERRY_TO_NUMPY.get(dtype)
    if name is None:
        return np.frombuffer(memory, dtype=np.uint8)
    return np.frombuffer(memory, dtype=name).reshape(shape)


CONVERTERS = {
    "torch": to_torch,
    "numpy": to_numpy,
    "memoryview": lambda dtype, shape, memory: memory,
}

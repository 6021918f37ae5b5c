"""ferry: weight sync for RL post-training (trainer -> rollout), from Python.

    import ferry
    ferry.Sender / ferry.Receiver        # the C++ sync engine (ferry.sync)
    ferry.Relay                          # one network copy per node, shm fan-out
    ferry.verl.BucketedWeightSender      # drop-in for verl's classes (ferry.verl)

Every C++ error raises a ferry.FerryError subclass named after its code (InvalidArgumentError,
TimeoutError, AbortedError, ...) with the C++ message; `error.code` is the code's name.
docs/python.md has the details.
"""

from ._ferry import (
    AbortedError,
    AlreadyExistsError,
    CorruptionError,
    DType,
    FailedPreconditionError,
    FerryError,
    InternalError,
    InvalidArgumentError,
    IoError,
    NotFoundError,
    ResourceExhaustedError,
    TimeoutError,
    UnauthenticatedError,
    UnimplementedError,
    __version__,
    hf_tensor_specs,
    parse_dtype,
    preset_names,
    tensor_bytes,
)
from ._tensors import ferry_dtype, to_numpy, to_torch, torch_dtype
from .rank_local import TensorSlice, local_tensors, vllm_tp_slices
from .sync import (MultiReceiver, Receiver, Relay, RoundStats, Sender, SyncOptions,
                   split_into_parts)

__all__ = [
    "AbortedError", "AlreadyExistsError", "CorruptionError", "DType", "FailedPreconditionError",
    "FerryError", "InternalError", "InvalidArgumentError", "IoError", "MultiReceiver",
    "NotFoundError", "Receiver", "Relay", "ResourceExhaustedError", "RoundStats", "Sender",
    "SyncOptions", "TensorSlice", "TimeoutError", "UnauthenticatedError", "UnimplementedError", "__version__",
    "ferry_dtype", "hf_tensor_specs", "local_tensors", "parse_dtype", "preset_names",
    "split_into_parts", "tensor_bytes", "to_numpy", "to_torch", "torch_dtype", "vllm_tp_slices",
]

"""engine_kwargs.ferry.tp_size > 1: every rollout rank yields only its tensor-parallel slice of
each tensor, as vLLM's weight loaders cut it (ferry.vllm_tp_slices), in verl's
`rank_local_named_tensors` form: (name, local tensor, ShardSpec).

The slice is taken where the tensor is received: a view of the ring (no copy) where the slice
is one block of it, or of the receive buffer (a copy of the slice only); on the device path
only the slice crosses to the device. Only a vocabulary slice that vLLM pads past the
vocabulary's end is copied, into zeros of its padded shape. The ring still carries each tensor
whole, once per node, and its checksum still covers every byte.

verl 0.9.1's vLLM and TensorRT-LLM adapters take only `named_tensors`: this form is for an
adapter that loads rank-local shards (verl #7552 adds the form; ferry.verl.cpu_rollout takes
it in tests)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch

from .. import _ferry
from .._tensors import _error, ferry_dtype
from ..rank_local import _config_text, vllm_tp_slices

WIRE_FORMAT = "rank_local_named_tensors"

try:  # verl's own descriptor of a rank-local shard, where verl is installed
    from verl.workers.engine.spec import BlockPlacement, ShardSpec
except ImportError:
    @dataclass(frozen=True)
    class BlockPlacement:  # type: ignore[no-redef]
        """verl's BlockPlacement: the local tensor is full[o0:o0+l0, o1:o1+l1, ...]."""
        local_shape: tuple
        global_offset: tuple
        full_shape: tuple

    @dataclass
    class ShardSpec:  # type: ignore[no-redef]
        """verl's ShardSpec, as far as a rank-local receiver fills it."""
        full_shape: tuple
        place: Any = None


def parse_tp_size(value: Any) -> int:
    """engine_kwargs.ferry.tp_size: the rollout's tensor-parallel size (1: whole tensors)."""
    if isinstance(value, bool) or not str(value).strip().isdigit() or int(value) < 1:
        raise _error(_ferry.InvalidArgumentError,
                     f"engine_kwargs.ferry.tp_size={value!r}: expected a positive integer (the "
                     "rollout's tensor_model_parallel_size)")
    return int(value)


@dataclass(frozen=True)
class _Cut:
    """Where one tensor's slice lies: per dimension its start and the length the whole tensor
    has there (shorter than local_shape only in vLLM's vocabulary padding)."""
    starts: tuple
    lengths: tuple
    local_shape: tuple
    spec: Any

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        view = tensor
        for dim, (start, length) in enumerate(zip(self.starts, self.lengths)):
            if start or length != tensor.shape[dim]:
                view = view.narrow(dim, start, length)
        if self.lengths == self.local_shape:
            return view
        local = tensor.new_zeros(self.local_shape)  # padding rows stay zero, as vLLM's
        local[tuple(slice(0, n) for n in self.lengths)].copy_(view)
        return local


class LocalSlicer:
    """One rollout rank's slices: cut(name, tensor) -> (name, local tensor, ShardSpec)."""

    def __init__(self, hf_config: Any, tp_rank: int, tp_size: int) -> None:
        # Read once, here: a missing folder fails joining the topology, not an update.
        text = _config_text(hf_config)
        try:
            self._config: Any = json.loads(text)
        except ValueError:
            self._config = text  # a preset name
        self.tp_rank, self.tp_size = int(tp_rank), int(tp_size)
        self._cuts: dict[tuple, _Cut] = {}

    def cut(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor, Any]:
        key = (name, tensor.dtype, tuple(tensor.shape))
        cut = self._cuts.get(key)
        if cut is None:
            cut = self._cuts[key] = self._cut_for(name, tensor)
        return name, cut.apply(tensor), cut.spec

    def _cut_for(self, name: str, tensor: torch.Tensor) -> _Cut:
        whole = tuple(tensor.shape)
        (s,) = vllm_tp_slices(self._config, [(name, ferry_dtype(tensor.dtype), whole)],
                              self.tp_rank, self.tp_size)
        local = tuple(s.local[2])
        # vLLM's slices are blocks: the first selected byte is the block's origin.
        if s.runs:
            flat = s.runs[0][1] // tensor.element_size()
            starts = []
            for extent in reversed(whole):
                starts.append(flat % extent if extent else 0)
                flat = flat // extent if extent else 0
            starts = tuple(reversed(starts))
        else:  # only padding rows: nothing of the tensor is selected
            starts = (whole[0],) + (0,) * (len(whole) - 1) if whole else ()
        lengths = tuple(max(0, min(n, w - o)) for n, w, o in zip(local, whole, starts))
        if math.prod(lengths) * tensor.element_size() != s.selected_bytes:
            raise _error(_ferry.InternalError,
                         f"rank-local slice of '{name}': the slice {s!r} is not one block of "
                         f"{list(whole)}")
        spec = ShardSpec(full_shape=whole,
                         place=BlockPlacement(local_shape=local, global_offset=starts,
                                              full_shape=whole))
        return _Cut(starts, lengths, local, spec)

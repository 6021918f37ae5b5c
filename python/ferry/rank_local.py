"""Rank-local delivery: each tensor-parallel rank of a rollout engine receives only its slice
of every tensor (docs/rank_local.md).

    slices = ferry.vllm_tp_slices("qwen2.5-0.5b", specs, tp_rank=1, tp_size=2)
    local = ferry.local_tensors(slices)              # zeros, each of its slice's shape
    for s in slices:
        receiver.set_destination(s.name, local[s.name], slice=s)
    receiver.receive_round_into()                    # copies only this rank's bytes

The slices follow vLLM's tensor-parallel layout for the Llama, Qwen2 and Qwen3 dense
families (include/ferry/vllm_slices.h states each rule)."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from . import _ferry
from ._tensors import _error, ferry_dtype, torch_dtype

TensorSlice = _ferry.TensorSlice


def _config_text(config: Any) -> str:
    """A preset name, or config.json's text, from what a caller has at hand."""
    if isinstance(config, Mapping):
        return json.dumps(dict(config))
    if hasattr(config, "to_json_string"):  # transformers.PretrainedConfig
        return config.to_json_string()
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return f.read()
        if isinstance(config, str) and os.sep not in config:
            return config  # a preset name; the C++ side lists the names if it is not one
        raise _error(_ferry.NotFoundError, f"model config '{path}': no such file")
    raise _error(_ferry.InvalidArgumentError,
                 f"config: expected a preset name, a path, a dict or a transformers config, got "
                 f"{type(config).__name__}")


def _specs(tensors: Any) -> list[tuple]:
    if isinstance(tensors, Mapping):  # a state_dict: name -> tensor
        return [(name, ferry_dtype(t.dtype), tuple(t.shape)) for name, t in tensors.items()]
    return [(name, dtype if isinstance(dtype, _ferry.DType) else ferry_dtype(dtype), tuple(shape))
            for name, dtype, shape in tensors]


def vllm_tp_slices(config: Any, tensors: Any, tp_rank: int, tp_size: int) -> list[TensorSlice]:
    """The slice of each tensor that vLLM's tensor-parallel rank `tp_rank` of `tp_size` loads.

    `config`: a preset name (ferry.preset_names()), a model folder or config.json path,
    config.json's dict, or a transformers config. `tensors`: [(name, dtype, shape)] as the
    trainer sends them, or a state_dict. Raises InvalidArgumentError naming a tensor no rule
    covers, a shape the config contradicts, or a tp_size that does not divide the heads."""
    return _ferry.vllm_tp_slices(_config_text(config), _specs(tensors), int(tp_rank),
                                 int(tp_size))


def local_tensors(slices: Sequence[TensorSlice], device: str = "cpu") -> dict[str, Any]:
    """A zero torch tensor of each slice's local shape and dtype, by name: destinations for a
    receiver (padding rows a slice leaves uncovered stay zero, as vLLM keeps them)."""
    import torch

    out = {}
    for s in slices:
        name, dtype, shape = s.local
        out[name] = torch.zeros(shape, dtype=torch_dtype(dtype), device=device)
    return out

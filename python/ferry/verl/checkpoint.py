"""verl's Megatron checkpoints on node-local disks: importing this module is the switch.

    export VERL_USE_EXTERNAL_MODULES=ferry.verl.checkpoint   # before starting verl (and Ray)
    import ferry.verl.checkpoint                             # or, in a process of your own

verl imports each module VERL_USE_EXTERNAL_MODULES names whenever verl itself is imported,
so the variable switches every process that imports verl: the trainer's and each Ray worker
(actor, critic) that inherits it or gets it through Ray's runtime_env
(`+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=ferry.verl.checkpoint`).

The import replaces verl's save_dist_checkpointing / load_dist_checkpointing (verl 0.9.1,
verl/utils/megatron/dist_checkpointing.py) with versions of the same signatures that save and
load through ferry.dcp.megatron: every node gets `.metadata`, `metadata.json` and `common.pt`,
and a load on any node fetches the shards its node lacks. The names verl's checkpoint manager
and model merger imported from that module are replaced too when those are already imported
(later imports get the new ones). install() does the same again; it is idempotent.

Not covered: async_save (NotImplementedError naming the config key to turn off), verl's
load_mcore_dist_weights (initial weights from a converted checkpoint: megatron's default
load, untouched), the Megatron-FSDP path, and the files verl writes itself on one node
(huggingface/, transformer_config.json, ckpt_contents.json, the tracker
latest_checkpointed_iteration.txt; `ferry ckpt replicate` copies the tracker, see
docs/checkpoint.md).
"""

from __future__ import annotations

import sys
from typing import Any

import megatron.core
import torch
from megatron.core import mpu
from megatron.core.dist_checkpointing.strategies.fully_parallel import (
    FullyParallelLoadStrategyWrapper,
    FullyParallelSaveStrategyWrapper,
)
from megatron.core.dist_checkpointing.strategies.torch import TorchDistLoadShardedStrategy
from packaging import version

from ..dcp import megatron as node_local

__all__ = ["install", "load_dist_checkpointing", "save_dist_checkpointing"]

ASYNC_SAVE_KEYS = ("actor_rollout_ref.actor.checkpoint.async_save",
                   "critic.checkpoint.async_save")

# Where verl 0.9.1 holds the two functions: its own module, and two that import them by name.
_VERL_MODULES = ("verl.utils.megatron.dist_checkpointing",
                 "verl.utils.checkpoint.megatron_checkpoint_manager",
                 "verl.model_merger.megatron_model_merger")


def save_dist_checkpointing(sharded_state_dict: Any, ckpt_path: str, async_save: bool = False,
                            content_metadata: dict | None = None) -> None:
    """verl's save_dist_checkpointing through ferry.dcp.megatron (same strategy wrapping,
    same arguments to megatron); returns None, as verl's synchronous save."""
    if async_save:
        raise NotImplementedError(
            "ferry.verl.checkpoint saves Megatron checkpoints synchronously only: set "
            f"{' / '.join(ASYNC_SAVE_KEYS)}=False (verl's default), or do not import "
            "ferry.verl.checkpoint")
    strategy = FullyParallelSaveStrategyWrapper(
        node_local.NodeLocalSaveStrategy(backend="torch_dist", version=1),
        mpu.get_data_parallel_group(with_context_parallel=True))
    kwargs: dict[str, Any] = {}
    # As verl: megatron takes content_metadata from 0.14 on.
    if content_metadata is not None and (
            version.parse(megatron.core.__version__) >= version.parse("0.14.0")):
        kwargs["content_metadata"] = content_metadata
    node_local.save(sharded_state_dict, ckpt_path, sharded_strategy=strategy,
                    validate_access_integrity=True, **kwargs)


def load_dist_checkpointing(sharded_state_dict: Any, ckpt_dir: str) -> Any:
    """verl's load_dist_checkpointing through ferry.dcp.megatron; returns the state dict."""
    strategy = TorchDistLoadShardedStrategy()
    if torch.cuda.is_available():
        strategy = FullyParallelLoadStrategyWrapper(
            strategy, mpu.get_data_parallel_group(with_context_parallel=True))
    # Without CUDA, no wrapper: FullyParallelLoadStrategyWrapper.load calls
    # torch.cuda.synchronize() unconditionally (megatron 0.16.1 fully_parallel.py:272, :281),
    # and its default exchange ("broadcast") allocates on "cuda"; "gather_object" avoids only
    # the latter. Each rank then reads all it needs itself; the reader fetches what its node
    # lacks either way.
    try:  # as verl: torch.load's weights_only must accept these optimizer classes
        import transformer_engine as te

        torch.serialization.add_safe_globals([torch.optim.AdamW])
        torch.serialization.add_safe_globals([te.pytorch.optimizers.fused_adam.FusedAdam])
    except Exception:
        pass
    return node_local.load(sharded_state_dict, ckpt_dir, sharded_strategy=strategy)


def install() -> None:
    """Points verl's names at this module's functions (done on import)."""
    import importlib

    importlib.import_module(_VERL_MODULES[0])
    for name in _VERL_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue  # imported later, it takes the names from the first, patched, module
        for function in (save_dist_checkpointing, load_dist_checkpointing):
            if hasattr(module, function.__name__):
                setattr(module, function.__name__, function)


install()

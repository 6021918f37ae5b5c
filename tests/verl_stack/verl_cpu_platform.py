"""A CPU platform for verl, so its FSDP TrainingWorker runs on a machine without accelerator.

verl 0.9.1 registers nvidia, huawei and amd platforms only; with none available it falls back to
nvidia, and TrainingWorker.__init__ then asks torch.distributed for "cpu:gloo,cuda:nccl"
(RuntimeError: Distributed package doesn't have NCCL built in, on a CPU build of torch).
This registers "cpu" through verl's own extension points: VERL_USE_EXTERNAL_MODULES imports
this module in every process that imports verl, VERL_PLATFORM=cpu selects it (conftest.py
sets both before Ray starts, so every worker inherits them).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """Host memory and gloo; every device call is a no-op or its CPU meaning."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self):
        return torch.cpu

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # only by VERL_PLATFORM=cpu, never auto-detected

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        pass

    def synchronize(self, device_index=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self):
        return None

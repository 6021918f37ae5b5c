"""verl's checkpoint-engine base class and registry, or ferry's stand-ins where verl is absent.

verl (and the Ray it imports) are not Debian packages, so ferry's backend and its tests must
run without them. The stand-ins have verl's interface (verl/checkpoint_engine/base.py):
CheckpointEngine with prepare / build_topology / init_process_group / finalize /
send_weights / receive_weights, CheckpointEngineWithCache with get_weights, and
CheckpointEngineRegistry.register / get / new.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

try:
    from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
    HAVE_VERL = True
    try:
        from verl.checkpoint_engine.base import CheckpointEngineWithCache
    except ImportError:  # a verl older than the cache interface
        CheckpointEngineWithCache = CheckpointEngine
except ImportError:
    HAVE_VERL = False

    class CheckpointEngineRegistry:  # type: ignore[no-redef]
        """Backend name -> engine class, as verl's registry."""

        _registry: dict[str, type] = {}

        @staticmethod
        def register(backend: str):
            def wrapper(cls: type) -> type:
                CheckpointEngineRegistry._registry[backend] = cls
                return cls
            return wrapper

        @classmethod
        def get(cls, backend: str) -> type:
            return cls._registry[backend]

        @classmethod
        def new(cls, backend: str, *args: Any, **kwargs: Any) -> Any:
            if backend not in cls._registry:
                raise ValueError(f"Checkpoint engine {backend} not registered")
            return cls._registry[backend](*args, **kwargs)

    class CheckpointEngine(ABC):  # type: ignore[no-redef]
        """verl's abstract checkpoint engine (trainer -> rollout weight transfer)."""

        @abstractmethod
        def prepare(self) -> dict[str, Any]: ...

        @classmethod
        @abstractmethod
        def build_topology(cls, trainer_world_size: int, rollout_world_size: int,
                           metadata: list[dict]) -> tuple[dict[str, list], dict[str, list]]: ...

        @abstractmethod
        def init_process_group(self, **kwargs: Any) -> None: ...

        @abstractmethod
        def finalize(self) -> None: ...

        @abstractmethod
        async def send_weights(self, weights: Any) -> Any: ...

        @abstractmethod
        def receive_weights(self) -> Any: ...

    class CheckpointEngineWithCache(CheckpointEngine):  # type: ignore[no-redef]
        """verl's engine that also serves the last weights from a local cache."""

        @abstractmethod
        def get_weights(self) -> Any: ...

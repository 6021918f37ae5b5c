"""ferry's verl backend under verl's real classes and real Ray, on the CPU.

Real: Ray (one local session for the whole run), verl's CheckpointEngineManager (it drives
every update: prepare, build_topology, init_process_group, send/receive, finalize),
CheckpointEngineWorker (the rollout ranks; CpuCheckpointEngineWorker only builds its adapter),
RayWorkerGroup / RayResourcePool, RolloutReplica (subclassed by CpuRolloutReplica), the
configs, and the FSDP TrainingWorker as trainer (verl_stack_support.py says what it takes to
run on the CPU). Stand-in: the rollout server, ferry.verl.cpu_rollout.CpuServerAdapter (a
transformers model on the CPU) for vLLM, which cannot run without a GPU.

Run from the build directory with PYTHONPATH=<build>/python; paths here come from __file__.
The session shares one Ray instance, one model, one rollout pool and one trainer per world
size: global_steps therefore rises across the whole session (a rollout rank refuses an older
one), and a test that replaces a rollout replica leaves its replacement in the pool.
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# Before verl is imported, here and (inherited through Ray's local raylet) in every worker.
os.environ.update({
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",                          # 2 cores, several processes
    "VERL_USE_EXTERNAL_MODULES": "verl_cpu_platform",  # verl_cpu_platform.py
    "VERL_PLATFORM": "cpu",
    "VERL_ENGINE_DEVICE": "cuda",                   # verl's FSDP engine is registered for cuda
    "PYTHONPATH": os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p),
})
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import ray  # noqa: E402
import torch  # noqa: E402

from verl_stack_checks import ENGINE_TIMEOUT_S, BUCKET_MB, Stack  # noqa: E402
from verl.workers.config import (CheckpointEngineConfig, HFModelConfig,  # noqa: E402
                                 RolloutConfig)


@pytest.fixture(scope="session")
def ray_session():
    # Logical CPUs, one per worker: the session keeps every group it made alive (Stack.groups),
    # and a placement group that does not fit waits for good.
    ray.init(num_cpus=32, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> str:
    """A tiny random Qwen2 (2 layers, hidden 128, vocab 4096; fp32, 5.3 MB), untied."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                         max_position_embeddings=256, tie_word_embeddings=False)
    path = str(tmp_path_factory.mktemp("tiny_qwen2"))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def stack(ray_session, model_path) -> Stack:
    model_config = HFModelConfig(path=model_path, load_tokenizer=False,
                                 override_config={"attn_implementation": "eager"})
    ce_config = CheckpointEngineConfig(
        backend="ferry", custom_backend_module="ferry.verl.checkpoint_engine",
        update_weights_bucket_megabytes=BUCKET_MB,
        engine_kwargs={"ferry": {"timeout_s": ENGINE_TIMEOUT_S}})
    rollout_config = RolloutConfig(name="vllm", tensor_model_parallel_size=1,
                                   load_format="dummy", checkpoint_engine=ce_config)
    return Stack(model_config, rollout_config, ce_config)



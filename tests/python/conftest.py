"""Helpers for ferry's Python tests: unique addresses, spawned peers, checksums.

Run with the build tree on PYTHONPATH (ctest does: tests/python/tests.cmake):
    PYTHONPATH=build/python .venv/bin/python -m pytest -q tests/python
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import queue
import sys
import time
import uuid

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

PROCESS_TIMEOUT_S = 120


def unique_address() -> str:
    return f"@ferry-test-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def unique_zmq_handle() -> str:
    return f"ipc:///tmp/ferry-test-zmq-{uuid.uuid4().hex}.sock"


def digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes in row-major order (any dtype, any strides)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return hashlib.sha256(b"").hexdigest()
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def run_peers(*targets_and_args: tuple) -> list:
    """Runs each (target, args...) in a spawned process; returns what each put on its queue.

    Every target gets a result queue as its last argument and must put exactly one item.
    A process that hangs past PROCESS_TIMEOUT_S is killed and the test fails.
    """
    ctx = mp.get_context("spawn")
    queues, procs, names = [], [], []
    for target, *args in targets_and_args:
        names.append(target.__name__)
        q = ctx.Queue()
        p = ctx.Process(target=target, args=(*args, q))
        p.start()
        queues.append(q)
        procs.append(p)
    results = []
    try:
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        for q, p, name in zip(queues, procs, names):
            while True:
                try:
                    results.append(q.get(timeout=0.5))
                    break
                except queue.Empty:
                    if p.exitcode is not None and q.empty():
                        pytest.fail(f"{p.name} ({name}) died with exit code "
                                    f"{p.exitcode} before giving a result")
                    if time.monotonic() > deadline:
                        pytest.fail(f"{p.name} ({name}): no result in {PROCESS_TIMEOUT_S} s")
        for p in procs:
            p.join(PROCESS_TIMEOUT_S)
            assert not p.is_alive(), f"{p.name} did not exit"
            assert p.exitcode == 0, f"{p.name} exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return results


def run_ok_peers(sender, receiver, handle: str | None = None) -> tuple:
    """run_peers((sender, handle), (receiver, handle)) over `handle` (default: a fresh ipc
    handle); both must answer ("ok", ...). Returns (sent, received)."""
    handle = handle or unique_zmq_handle()
    sent, received = run_peers((sender, handle), (receiver, handle))
    assert sent[0] == "ok", sent
    assert received[0] == "ok", received
    return sent, received

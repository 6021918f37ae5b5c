"""Helpers for ferry's Python tests: unique addresses, spawned peers, checksums.

Run with the build tree on PYTHONPATH (ctest does: tests/python/tests.cmake):
    PYTHONPATH=build/python .venv/bin/python -m pytest -q tests/python
"""

from __future__ import annotations

import functools
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

# Modules the fork server imports once for the whole run. A spawned process imported them
# again: ferry's verl backend brings verl, Ray and transformers, about 6 s of CPU each time,
# which was most of the Python tests' time in CI.
FORK_SERVER_PRELOAD = ["torch", "ferry.verl.checkpoint_engine"]


@functools.cache
def processes():
    """multiprocessing's "forkserver" context: a peer process forks from a server that holds
    FORK_SERVER_PRELOAD, in a clean state as under "spawn" (no test's patches, one thread)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORK_SERVER_PRELOAD)
    return ctx


def _in_environment(environ: dict, target, args: tuple) -> None:
    os.environ.clear()
    os.environ.update(environ)
    target(*args)


def new_process(target, *args, daemon: bool = False):
    """An unstarted process running target(*args) under this process's environment as it is
    now, as "spawn" would give it (the fork server's own is from the server's start)."""
    return processes().Process(target=_in_environment, args=(dict(os.environ), target, args),
                               daemon=daemon, name=f"{target.__name__}-{uuid.uuid4().hex[:6]}")


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
    """Runs each (target, args...) in a process of its own; returns what each put on its queue.

    Every target gets a result queue as its last argument and must put exactly one item.
    A process that hangs past PROCESS_TIMEOUT_S is killed and the test fails.
    """
    queues, procs, names = [], [], []
    for target, *args in targets_and_args:
        names.append(target.__name__)
        q = processes().Queue()
        p = new_process(target, *args, q)
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

"""Launching a test job of worker ranks (dcp_worker.py, megatron_worker.py) as torchrun would:
one process per rank with torchrun's environment, the ranks of a node sharing its folder, and
when one rank dies the rest are stopped (torchrun's default), so a killed save ends as it would
on a cluster.

A rank forks from a server that imported torch, torch.distributed.checkpoint, megatron-core and
the workers once (multiprocessing's "forkserver"): a new interpreter per rank spent about 3 s
of CPU importing them, most of this suite's time."""

from __future__ import annotations

import functools
import importlib
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from dataclasses import dataclass, field

PRELOAD = ["torch", "torch.distributed.checkpoint", "megatron.core.dist_checkpointing",
           "ferry.dcp", "dcp_worker", "megatron_worker"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Job:
    returncodes: list[int]
    results: list[dict] = field(default_factory=list)  # one per rank that got to report
    output: str = ""

    def errors(self) -> list[str]:
        return [r["error"] for r in self.results if not r["ok"]]


@functools.cache
def _ranks():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _rank_main(worker: str, argv: list[str], environ: dict, log: str) -> None:
    """One rank: `worker`'s main() with argv, environ and its output in `log`."""
    os.environ.clear()
    os.environ.update(environ)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    import torch
    torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))  # torch was imported without it
    module = importlib.import_module(worker)
    sys.argv = [module.__file__, *argv]
    sys.exit(module.main())


def run(mode: str, nodes: list[str], root: str, *extra: str, env: dict | None = None,
        timeout: float = 300, worker: str = "dcp_worker.py") -> Job:
    """Runs len(nodes) ranks of `worker` (a script in tests/dcp), rank i on node nodes[i]."""
    stamp = time.monotonic_ns()
    result_file = os.path.join(root, f".result-{mode}-{stamp}.jsonl")
    port = free_port()
    procs, logs = [], []
    for rank, node in enumerate(nodes):
        penv = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(nodes)),
                    LOCAL_RANK=str(nodes[:rank].count(node)), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port), FERRY_DCP_NODE=node, OMP_NUM_THREADS="1",
                    **(env or {}))
        argv = [mode, "--root", root, "--result", result_file, *extra]
        logs.append(os.path.join(root, f".log-{mode}-{stamp}-{rank}"))
        procs.append(_ranks().Process(
            target=_rank_main, args=(worker.removesuffix(".py"), argv, penv, logs[-1]),
            name=f"rank {rank} ({node})"))
        procs[-1].start()
    deadline = time.monotonic() + timeout
    while any(p.exitcode is None for p in procs):
        if any(p.exitcode is not None and p.exitcode < 0 for p in procs):
            time.sleep(1.0)  # a rank was killed: stop the others, as torchrun does
            for p in procs:
                if p.exitcode is None:
                    p.kill()
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise AssertionError(f"job {mode} on {nodes} did not end within {timeout} s")
        time.sleep(0.1)
    for p in procs:
        p.join()
    output = []
    for i, log in enumerate(logs):
        if not os.path.exists(log):  # stopped before it got to open its log
            output.append(f"--- rank {i}\n(no output)")
            continue
        with open(log, errors="replace") as f:
            output.append(f"--- rank {i}\n{f.read()}")
        os.unlink(log)
    results = []
    if os.path.exists(result_file):
        with open(result_file) as f:
            results = [json.loads(line) for line in f if line.strip()]
        os.unlink(result_file)
    return Job([p.exitcode for p in procs], sorted(results, key=lambda r: r["rank"]),
               "\n".join(output))

"""Launching a test job of worker ranks (dcp_worker.py, megatron_worker.py) as torchrun would:
one process per rank, the ranks of a node sharing its folder, and when one rank dies the rest
are stopped (torchrun's default), so a killed save ends as it would on a cluster."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))


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


def run(mode: str, nodes: list[str], root: str, *extra: str, env: dict | None = None,
        timeout: float = 300, prefix: list[str] | None = None,
        worker: str = "dcp_worker.py") -> Job:
    """Runs len(nodes) ranks of `worker` (a script in tests/dcp), rank i on node nodes[i];
    `prefix` (per node) wraps the command, e.g. ["ip", "netns", "exec", "ns0"]."""
    result_file = os.path.join(root, f".result-{mode}-{time.monotonic_ns()}.jsonl")
    port = free_port()
    procs = []
    for rank, node in enumerate(nodes):
        penv = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(nodes)),
                    LOCAL_RANK=str(nodes[:rank].count(node)), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port), FERRY_DCP_NODE=node, OMP_NUM_THREADS="1",
                    **(env or {}))
        cmd = [sys.executable, os.path.join(HERE, worker), mode, "--root", root,
               "--result", result_file, *extra]
        procs.append(subprocess.Popen(cmd, env=penv, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        if any(p.returncode not in (None, 0) and p.returncode < 0 for p in procs):
            time.sleep(1.0)  # a rank was killed: stop the others, as torchrun does
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise AssertionError(f"job {mode} on {nodes} did not end within {timeout} s")
        time.sleep(0.1)
    output = "\n".join(f"--- rank {i}\n{p.stdout.read()}" for i, p in enumerate(procs))
    results = []
    if os.path.exists(result_file):
        with open(result_file) as f:
            results = [json.loads(line) for line in f if line.strip()]
        os.unlink(result_file)
    return Job([p.returncode for p in procs], sorted(results, key=lambda r: r["rank"]), output)

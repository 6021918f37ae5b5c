#!/usr/bin/env python3
"""ferry.dcp (NodeLocalWriter / NodeLocalReader) beside DCP's FileSystemWriter / Reader and the
disk's own sequential write bandwidth, one run, one machine, one state dict (issue 35).

    cd build && ninja -j2 ferry_python_package
    PYTHONPATH=$PWD/python ../.venv/bin/python ../bench/dcp_bench.py [--preset qwen2.5-0.5b]
        [--repeat 3] [--root DIR] [--json OUT.json] [--warm-loads]

The state: tests/dcp/dcp_worker.py's make_state (every tensor of the preset as a DTensor
sharded by rows, plus an exp_avg of each and a step; bf16), in ranks that are processes over
gloo, as tests/dcp/dcp_job.py runs them: "2 nodes" are 2 folders, root/node0 and root/node1.
DCP's writer and reader use one shared folder, root/shared. Two jobs live through the run:

  save layout  4 ranks, node0 = ranks 0-1, node1 = ranks 2-3: the saves and the same-layout
               loads
  reshard      2 ranks, rank 0 on node1 and rank 1 on node0: each needs the rows that the
               other node's ranks saved, so each node fetches the other node's half of the
               checkpoint (every byte these ranks load crosses nodes)

Each repetition (ferry and DCP in alternating order, so drift weighs on both alike):
  1. save: ferry.dcp.save to the node folders and dcp.save(FileSystemWriter) to the shared
     folder, both sync_files=True (fsync per file, as DCP does)
  2. disk: the bytes of that save (the sum of ferry's shard files), split as the ranks split
     them: 4 writer processes at once, each writing its rank's share to a file of its own in
     its node's folder (16 MiB writes, then fsync), and 1 process writing all of it
  3. load, same layout (4 ranks): ferry.dcp.load from the node folders (each node has its
     ranks' shards; the one small file of replicated items is fetched), DCP's FileSystemReader
     from the shared folder
  4. load, resharded (2 ranks on the other nodes): ferry.dcp.load and DCP from the shared
     folder
Before every ferry load the files earlier loads fetched are removed (tests/dcp/
test_node_local.py's forget_fetched), so each starts from what the save left.
Before every load the checkpoint's files are dropped from the page cache
(posix_fadvise(DONTNEED); every file was fsynced, so its pages are clean and go): loads read
the disk, as after a restart. --warm-loads leaves them cached.

Before the first repetition each job saves and loads a tiny state once through both writers
and readers (untimed), so no timed operation pays a first call's imports and set-up.
Timing is inside the ranks: barrier, clock, dcp.save / dcp.load, clock, barrier; the slowest
rank's seconds count. CPU is getrusage(RUSAGE_SELF) of each rank (all its threads: DCP's
writer, ferry's file server and puller) summed over the ranks, per GB of checkpoint; the
kernel's own writeback threads are not in it. "peak +MB": the most any rank's resident memory
grew during the operation (VmHWM, reset through /proc/self/clear_refs, minus VmRSS before).
The last column splits the slowest rank's wall: "write" DCP's writing of the shard files
(serialize, write, fsync: the same code in both writers), "hash" ferry hashing them for its
index, "fetch" ferry finding and fetching what a node lacks, "read" DCP's reading (torch.load
of each item, copy into the state; the same code in both readers, after ferry's fetch).
Every load is checked bit-exact against make_state(fill=True) at its own layout (what
check_state expects), made once per rank before timing; the loaded tensors are refilled with
7s before each load. Figures are medians over the repetitions; ratios are medians of the
per-repetition ratios (both sides measured minutes apart at most).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DCP = os.path.join(HERE, "..", "tests", "dcp")
SAVE_LAYOUT = ["node0", "node0", "node1", "node1"]
RESHARD_LAYOUT = ["node1", "node0"]
STEP = 1
CHUNK = 16 << 20


# ---------------------------------------------------------------------------------------------
# Helpers shared by the driver and its processes


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def proc_status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------
# A disk writer process: `dcp_bench.py _write PATH BYTES`


def writer_main(path: str, nbytes: int) -> None:
    block = bytes(range(256)) * (CHUNK // 256)  # not zeros: nothing can skip them
    view = memoryview(block)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    print("ready", flush=True)
    sys.stdin.readline()  # "go"
    c0, t0 = cpu_seconds(), time.monotonic()
    left = nbytes
    while left:
        n = os.write(fd, view[:min(left, CHUNK)])
        left -= n
    os.fsync(fd)
    os.close(fd)
    t1, c1 = time.monotonic(), cpu_seconds()
    print(json.dumps({"t0": t0, "t1": t1, "cpu_s": c1 - c0}), flush=True)


def write_limit(jobs: list[tuple[str, int]]) -> dict:
    """Writers started at once, each (path, bytes); wall from the first start to the last fsync."""
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "_write", path, str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for path, n in jobs]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    out = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        p.wait(60)
    total = sum(n for _, n in jobs)
    wall = max(o["t1"] for o in out) - min(o["t0"] for o in out)
    for path, _ in jobs:
        os.unlink(path)
    return {"seconds": wall, "gbps": total / wall / 1e9, "cpu_s": sum(o["cpu_s"] for o in out),
            "bytes": total}


# ---------------------------------------------------------------------------------------------
# A rank: `dcp_bench.py _rank ...`, commanded one JSON line at a time on stdin


def rank_main(args: argparse.Namespace) -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to the rank's log
    sys.path.insert(0, TESTS_DCP)
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    import dcp_worker
    import ferry
    import ferry.dcp

    phases = instrument()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    node = os.environ["FERRY_DCP_NODE"]
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    specs = ferry.hf_tensor_specs(args.preset)
    dtype = dcp_worker.DTYPES[args.dtype]
    # What this layout's shards hold after a correct load (check_state's expectation), and the
    # state the loads fill; the save layout saves `reference`.
    reference = dcp_worker.make_state(specs, mesh, STEP, dtype, fill=True)
    target = dcp_worker.make_state(specs, mesh, STEP, dtype, fill=False)

    def pairs():
        for part in ("model", "optim"):
            for key, tensor in target[part].items():
                ref = reference[part][key]
                if key == "step":
                    yield key, tensor, ref
                else:
                    yield key, tensor.to_local(), ref.to_local()

    local_bytes = sum(r.numel() * r.element_size() for _, _, r in pairs())
    proto.write("@@" + json.dumps({"rank": rank, "node": node, "ready": True,
                                   "local_bytes": local_bytes}) + "\n")

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        if op == "warmup":  # each path once, on a tiny state: first-call costs off the clock
            tiny = dcp_worker.make_state([("warmup.weight", None, (256, 64))], mesh, STEP,
                                         dtype, fill=True)
            local = os.path.join(args.root, node, cmd["name"])
            shared = os.path.join(args.root, "shared", cmd["name"])
            ferry.dcp.save(tiny, local)
            ferry.dcp.load(tiny, local)
            dcp.save(tiny, storage_writer=dcp.FileSystemWriter(shared))
            dcp.load(tiny, storage_reader=dcp.FileSystemReader(shared))
            dist.barrier()
            proto.write("@@" + json.dumps({"rank": rank, "ok": True}) + "\n")
            continue
        out = {"rank": rank, "node": node, "op": op, "ok": True, "error": None,
               "fetched_bytes": 0}
        if op in ("load", "dcp-load"):
            for _, got, _ in pairs():
                got.fill_(7 if got.dim() else -1)
        if op in ("save", "load"):
            folder = os.path.join(args.root, node, cmd["name"])
        else:
            folder = os.path.join(args.root, "shared", cmd["name"])
        phases.clear()
        reset_peak_rss()
        rss0 = proc_status_kb("VmRSS")
        dist.barrier()
        c0, t0 = cpu_seconds(), time.monotonic()
        try:
            if op == "save":
                ferry.dcp.save(reference, folder, sync_files=True)
            elif op == "dcp-save":
                dcp.save(reference, storage_writer=dcp.FileSystemWriter(folder, sync_files=True))
            elif op == "load":
                out["fetched_bytes"] = ferry.dcp.load(target, folder).fetched_bytes
            elif op == "dcp-load":
                dcp.load(target, storage_reader=dcp.FileSystemReader(folder))
            else:
                raise ValueError(f"unknown op {op}")
        except Exception as e:  # DCP raises on every rank; all reach the barrier below
            out.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000])
        t1, c1 = time.monotonic(), cpu_seconds()
        dist.barrier()
        out.update(seconds=t1 - t0, cpu_s=c1 - c0,
                   peak_mb=(proc_status_kb("VmHWM") - rss0) / 1024, phases=dict(phases))
        if op in ("load", "dcp-load") and out["ok"]:
            bad = [key for key, got, ref in pairs() if not torch.equal(got, ref)]
            if bad:
                out.update(ok=False, error=f"loaded values differ in {len(bad)} tensors, "
                                           f"e.g. {bad[:3]}")
        proto.write("@@" + json.dumps(out) + "\n")
    dist.destroy_process_group()


def instrument() -> dict:
    """Wraps the parts of ferry.dcp whose time the table breaks out (in this process only; the
    code they run is unchanged): seconds per phase of the current operation."""
    from torch.distributed.checkpoint import filesystem

    from ferry.dcp import reader, writer

    phases: dict = {}

    def timed(owner, name, phase):
        inner = getattr(owner, name)

        def wrapper(*a, **k):
            t0 = time.monotonic()
            try:
                return inner(*a, **k)
            finally:
                phases[phase] = phases.get(phase, 0.0) + time.monotonic() - t0
        setattr(owner, name, wrapper)

    # save: DCP's writing of the shard files (serialize, write, fsync; ferry's writer calls
    # the same code) / ferry hashing them for its index
    timed(filesystem._FileSystemWriter, "_write_data", "write_s")
    timed(writer.NodeLocalWriter, "_describe", "hash_s")
    # load: ferry finding, serving and fetching what this node lacks / DCP reading the files
    # (torch.load of each item, copy into the state; ferry's reader calls the same code after
    # its fetch). The rest of the wall: planning, metadata and the collectives.
    timed(reader.NodeLocalReader, "_fetch_missing", "fetch_s")
    timed(filesystem.FileSystemReader, "read_data", "read_s")
    return phases


# ---------------------------------------------------------------------------------------------
# The driver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """len(nodes) rank processes of one process group, as dcp_job.run starts them, kept alive
    and given one command at a time."""

    def __init__(self, nodes: list[str], args: argparse.Namespace, logdir: str, tag: str):
        port = free_port()
        self.procs, self.logs = [], []
        for rank, node in enumerate(nodes):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(nodes)),
                       LOCAL_RANK=str(nodes[:rank].count(node)), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), FERRY_DCP_NODE=node, OMP_NUM_THREADS="1")
            log = os.path.join(logdir, f"{tag}-rank{rank}.log")
            self.logs.append(log)
            with open(log, "w") as f:
                self.procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "_rank", "--root", args.root,
                     "--preset", args.preset, "--dtype", args.dtype],
                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=f, text=True))
        self.tag = tag

    def read(self, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        out = []
        for rank, p in enumerate(self.procs):
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([p.stdout], [], [], left)[0]:
                    self.fail(f"rank {rank} gave no answer within {timeout:.0f} s")
                line = p.stdout.readline()
                if not line:
                    self.fail(f"rank {rank} exited ({p.wait()})")
                if line.startswith("@@"):
                    out.append(json.loads(line[2:]))
                    break
        return out

    def call(self, op: str, name: str, timeout: float = 600) -> list[dict]:
        for p in self.procs:
            p.stdin.write(json.dumps({"op": op, "name": name}) + "\n")
            p.stdin.flush()
        out = self.read(timeout)
        errors = [f"rank {r['rank']}: {r['error']}" for r in out if not r["ok"]]
        if errors:
            self.fail(f"{op} {name}: " + "; ".join(errors))
        return out

    def fail(self, why: str) -> None:
        self.close(kill=True)
        tails = []
        for log in self.logs:
            with open(log) as f:
                tails.append(f"--- {log}\n" + f.read()[-3000:])
        raise SystemExit(f"{self.tag}: {why}\n" + "\n".join(tails))

    def close(self, kill: bool = False) -> None:
        for p in self.procs:
            if p.poll() is None:
                if kill:
                    p.kill()
                else:
                    try:
                        p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                        p.stdin.flush()
                    except OSError:
                        pass
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def node_folder(root: str, node: str, name: str) -> str:
    return os.path.join(root, node, name)


def forget_fetched(root: str, name: str) -> int:
    """tests/dcp/test_node_local.py's forget_fetched: removes the shard files a node holds
    but another node wrote (what loads fetched). Returns the bytes removed."""
    import ferry.dcp
    removed = 0
    for node in ("node0", "node1"):
        folder = node_folder(root, node, name)
        index = ferry.dcp.read_committed(folder)
        mine = {e.path for e in index.files.values() if e.host == node or e.rank < 0}
        for entry in os.listdir(folder):
            if entry.startswith("__") and entry not in mine:
                removed += os.path.getsize(os.path.join(folder, entry))
                os.unlink(os.path.join(folder, entry))
    return removed


def evict(folders: list[str]) -> None:
    """Drops the folders' files from the page cache (clean pages only: they were fsynced)."""
    for folder in folders:
        for entry in os.listdir(folder):
            path = os.path.join(folder, entry)
            if not os.path.isfile(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def shard_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, e)) for e in os.listdir(folder)
               if e.endswith(".distcp"))


def summarize(results: list[dict], gigabytes: float) -> dict:
    return {"seconds": max(r["seconds"] for r in results),
            "cpu_s": sum(r["cpu_s"] for r in results),
            "cpu_s_per_gb": sum(r["cpu_s"] for r in results) / gigabytes,
            "fetched_bytes": sum(r["fetched_bytes"] for r in results),
            "peak_mb": max(r["peak_mb"] for r in results),
            # per phase, the slowest rank's seconds
            "phases": {k: max(r["phases"].get(k, 0.0) for r in results)
                       for k in sorted({k for r in results for k in r["phases"]})},
            "ranks": results}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_write":
        writer_main(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "_rank"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--root", help="folder for the checkpoints (default: a temporary one, "
                                       "removed after)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--warm-loads", action="store_true",
                        help="leave the checkpoint's files in the page cache before loads")
    args = parser.parse_args()
    if args.mode == "_rank":
        rank_main(args)
        return

    own_root = args.root is None
    args.root = os.path.abspath(args.root or tempfile.mkdtemp(prefix="ferry-dcp-bench-"))
    for sub in ("node0", "node1", "shared", "logs"):
        os.makedirs(os.path.join(args.root, sub), exist_ok=True)
    logdir = os.path.join(args.root, "logs")
    load_before = os.getloadavg()
    started = time.monotonic()
    print(f"{args.preset} {args.dtype}, {args.repeat} repetitions, root {args.root}, "
          f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} "
          f"{load_before[1]:.2f} {load_before[2]:.2f}; loads "
          f"{'warm' if args.warm_loads else 'cold (page cache dropped)'}", flush=True)

    import ferry.dcp

    jobs = []
    try:
        save_job = Job(SAVE_LAYOUT, args, logdir, "save")
        jobs.append(save_job)
        reshard_job = Job(RESHARD_LAYOUT, args, logdir, "reshard")
        jobs.append(reshard_job)
        ready = save_job.read(900) + reshard_job.read(900)
        for job, tag in ((save_job, "save"), (reshard_job, "reshard")):
            job.call("warmup", f"warmup-{tag}")
        state_bytes = sum(r["local_bytes"] for r in ready[:len(SAVE_LAYOUT)])
        print(f"  ranks ready after {time.monotonic() - started:.0f} s (state: "
              f"{state_bytes / 1e9:.3f} GB over {len(SAVE_LAYOUT)} ranks)", flush=True)
        reps = []
        for rep in range(args.repeat):
            ferry_first = rep % 2 == 0
            name = f"r{rep}"
            r: dict = {}
            # 1. saves
            for kind in (("ferry", "dcp") if ferry_first else ("dcp", "ferry")):
                op = "save" if kind == "ferry" else "dcp-save"
                r[f"save_{kind}"] = save_job.call(op, name)
            ferry_folders = [node_folder(args.root, n, name) for n in ("node0", "node1")]
            dcp_folders = [node_folder(args.root, "shared", name)]
            nbytes = sum(shard_bytes(f) for f in ferry_folders)
            dcp_nbytes = shard_bytes(dcp_folders[0])
            gb = nbytes / 1e9
            for kind in ("ferry", "dcp"):
                r[f"save_{kind}"] = summarize(r[f"save_{kind}"], gb)
            # 2. the disk, the same bytes split as the ranks split them
            index = ferry.dcp.read_committed(ferry_folders[0])
            per_rank = [0] * len(SAVE_LAYOUT)
            for e in index.files.values():
                if e.rank >= 0:
                    per_rank[e.rank] += e.bytes
            limit_dirs = [node_folder(args.root, n, f"disk_{name}") for n in ("node0", "node1")]
            for d in limit_dirs:
                os.makedirs(d)
            r["disk4"] = write_limit([(os.path.join(args.root, SAVE_LAYOUT[k], f"disk_{name}",
                                                    f"w{k}.bin"), per_rank[k])
                                      for k in range(len(SAVE_LAYOUT))])
            r["disk1"] = write_limit([(os.path.join(limit_dirs[0], "all.bin"), nbytes)])
            for d in limit_dirs:
                os.rmdir(d)
            # 3. same-layout loads, 4. resharded loads
            for job, tag in ((save_job, "same"), (reshard_job, "reshard")):
                for kind in (("ferry", "dcp") if ferry_first else ("dcp", "ferry")):
                    if kind == "ferry":
                        forget_fetched(args.root, name)
                    if not args.warm_loads:
                        evict(ferry_folders if kind == "ferry" else dcp_folders)
                    op = "load" if kind == "ferry" else "dcp-load"
                    r[f"load_{tag}_{kind}"] = summarize(job.call(op, name), gb)
            r["bytes"], r["dcp_bytes"] = nbytes, dcp_nbytes
            for f in ferry_folders + dcp_folders:
                shutil.rmtree(f)
            reps.append(r)
            print(f"  repetition {rep + 1}: " + ", ".join(
                f"{k} {v['seconds']:.2f} s" for k, v in r.items() if isinstance(v, dict)),
                flush=True)
    finally:
        for job in jobs:
            job.close()
    load_after = os.getloadavg()
    report(args, reps, load_before, load_after, time.monotonic() - started)
    if own_root:
        shutil.rmtree(args.root, ignore_errors=True)
    else:
        for sub in ("node0", "node1", "shared", "logs"):
            shutil.rmtree(os.path.join(args.root, sub), ignore_errors=True)


ROWS = [  # key, label
    ("disk1", "disk: 1 writer, all bytes, fsync"),
    ("disk4", "disk: 4 writers at once, each rank's share, fsync"),
    ("save_ferry", "save, ferry.dcp (node folders)"),
    ("save_dcp", "save, DCP FileSystemWriter (shared folder)"),
    ("load_same_ferry", "load 4 ranks same layout, ferry.dcp"),
    ("load_same_dcp", "load 4 ranks same layout, DCP FileSystemReader"),
    ("load_reshard_ferry", "load 2 ranks on the other nodes, ferry.dcp"),
    ("load_reshard_dcp", "load 2 ranks, DCP FileSystemReader"),
]

RATIOS = [  # label, numerator, denominator, what (seconds or GB/s), target
    ("save ferry / disk 4 writers (GB/s)", "save_ferry", "disk4", "gbps", ">= 0.8"),
    ("save ferry / disk 1 writer (GB/s)", "save_ferry", "disk1", "gbps", ""),
    ("save DCP / disk 4 writers (GB/s)", "save_dcp", "disk4", "gbps", ""),
    ("save ferry / save DCP (seconds)", "save_ferry", "save_dcp", "seconds", ""),
    ("load resharded ferry / same layout ferry (seconds)", "load_reshard_ferry",
     "load_same_ferry", "seconds", "<= 1.3"),
    ("load same layout ferry / DCP (seconds)", "load_same_ferry", "load_same_dcp", "seconds", ""),
    ("load resharded ferry / DCP 2 ranks (seconds)", "load_reshard_ferry", "load_reshard_dcp",
     "seconds", ""),
]


def report(args, reps, load_before, load_after, elapsed) -> None:
    def med(key: str, field: str) -> float:
        return statistics.median(r[key][field] for r in reps)

    for r in reps:
        gb = r["bytes"] / 1e9
        for key, _ in ROWS:
            r[key]["gbps"] = gb / r[key]["seconds"]
            r[key]["cpu_s_per_gb"] = r[key]["cpu_s"] / gb
    gb = statistics.median(r["bytes"] for r in reps) / 1e9
    print(f"\n{args.preset} {args.dtype}: {gb:.3f} GB of shard files per save (ferry; DCP "
          f"{statistics.median(r['dcp_bytes'] for r in reps) / 1e9:.3f} GB), median of "
          f"{len(reps)}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          f"{elapsed:.0f} s in all\n")
    print("| case | wall s | GB/s | CPU s/GB | fetched MB | peak +MB | "
          "of the wall s (slowest rank) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    rows = {}
    for key, label in ROWS:
        row = {f: med(key, f) for f in ("seconds", "gbps", "cpu_s_per_gb")}
        fetched = med(key, "fetched_bytes") if key.startswith("load") else None
        peak = med(key, "peak_mb") if "peak_mb" in reps[0][key] else None
        phases = {k: statistics.median(r[key]["phases"].get(k, 0.0) for r in reps)
                  for k in reps[0][key].get("phases", {})}
        row.update(fetched_bytes=fetched, peak_mb=peak, phases=phases)
        rows[key] = row
        split = ", ".join(f"{k[:-2]} {v:.2f}" for k, v in phases.items())
        print(f"| {label} | {row['seconds']:.2f} | {row['gbps']:.2f} | "
              f"{row['cpu_s_per_gb']:.2f} | "
              f"{'' if fetched is None else f'{fetched / 1e6:.3f}'} | "
              f"{'' if peak is None else f'{peak:.0f}'} | {split} |")
    print()
    ratios = {}
    for label, a, b, field, target in RATIOS:
        per_rep = [r[a][field] / r[b][field] for r in reps]
        value = statistics.median(per_rep)
        verdict = ""
        if target:
            op, limit = target.split()
            met = value >= float(limit) if op == ">=" else value <= float(limit)
            verdict = f"  target {target}: {'met' if met else 'NOT met'}"
        ratios[label] = {"median": value, "per_repetition": per_rep, "target": target}
        print(f"  {label} = {value:.3f}  ({', '.join(f'{x:.3f}' for x in per_rep)}){verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "dtype": args.dtype, "repeat": len(reps),
                       "warm_loads": args.warm_loads, "cpus": os.cpu_count(),
                       "load_average_before": load_before, "load_average_after": load_after,
                       "elapsed_s": elapsed, "bytes": statistics.median(r["bytes"] for r in reps),
                       "median": rows, "ratios": ratios, "repetitions": reps}, f, indent=1)
        print(f"\n  wrote {args.json}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""verl's checkpoint-engine backends side by side: one trainer -> 2 rollout processes, same run.

    PYTHONPATH=build/python python3 bench/verl_peers.py [--backends ferry,nixl,mooncake]
        [--bucket-mb 512,64] [--updates 4] [--passes 2] [--layers N] [--rollouts 2]
        [--json OUT.json]

Each backend is looked up by name in verl's CheckpointEngineRegistry (ferry's registers itself
when `ferry.verl.checkpoint_engine` is imported, as verl's custom_backend_module does) and
called as verl's CheckpointEngineManager.update_weights calls it, per update: prepare() on
every rank -> backend_cls.build_topology(1, rollouts, metadata) (evaluated in the trainer's
process, which is new for each backend, so no backend's imports or stand-ins reach another's) ->
init_process_group(**kwargs of that rank) on every rank at once -> send_weights(generator,
global_steps) on the trainer beside receive_weights(global_steps) on each rollout (which copies
every tensor it is handed into its resident model, as vLLM's load_weights does) -> finalize()
on every rank. Ranks are spawned processes driven over pipes (no Ray); each keeps one event
loop, as a Ray async actor does. The trainer's engine gets is_master=True and the rollouts'
none, with the same bucket_size (`update_weights_bucket_megabytes`) and engine_kwargs
(`--engine-kwargs`, JSON per backend; nixl and mooncake get device="cpu").

The model: bf16 tensors with the shapes of `--preset` (ferry.hf_tensor_specs; qwen2.5-0.5b:
290 tensors, 0.988 GB), `--layers N` keeping the first N decoder layers. Before each update
(untimed) the trainer changes two elements of every tensor; after it (untimed) every rank
hashes every tensor (BLAKE2b) and each rollout's hashes must equal the trainer's: a backend
that runs but delivers wrong, stale or missing tensors is reported as such.

Each bucket size runs `--passes` passes over the backends, in alternating order (a load that
drifts during the run weighs on each alike), each pass a new set of processes doing
`--updates` updates. Reported per backend and bucket size: seconds of the first update (of a
new set of processes; median over passes) and the median of the later ones (whole manager
sequence, prepare to finalize; the send/receive part apart), GB/s (model bytes / median later
update: what each rollout receives per second), and ratios measured in the same run: against
ferry's GB/s at the same bucket size and against one torch copy of the same bytes in one
process (`memcpy`, measured before each pass; median).

A backend that cannot run here (its import, its constructor, any call) is reported with its
exception's first lines and the run goes on with the others. `nixl+cpu` and `mooncake+cpu` run
verl's engine with the few process-local stand-ins its code needs on a CPU-only torch, listed
in the output (SHIMS below): verl's code paths assume CUDA (pinned memory, torch.cuda
synchronize, a device count) even where device="cpu" is accepted.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import importlib.machinery
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
import types
import warnings

import torch

# What each `+cpu` variant changes, in its own processes only (printed with the results).
SHIMS = {
    "nixl": [
        "torch.zeros(..., pin_memory=True) -> without pin_memory (CPU-only torch has no pinned "
        "allocator; verl's prepare() asks for it on device='cpu')",
        "torch.cuda.synchronize() -> no-op (verl calls it after every bucket; nothing to wait "
        "for on CPU)",
    ],
    "mooncake": [
        "sglang.srt.distributed.utils.StatelessProcessGroup -> a stand-in on torch's TCPStore "
        "(verl imports it from vllm or sglang, neither installed here)",
        "the engine's get_torch_device() -> a CPU module: device_count() 1, set_device, "
        "synchronize, empty_cache no-ops (CPU-only torch.cuda.device_count() is 0: "
        "`rank % device_count` divides by zero)",
        "MC_FORCE_TCP=1 (verl asks the transfer engine for 'rdma'; with no RDMA device it "
        "falls back to TCP anyway)",
    ],
}
DEFAULT_ENGINE_KWARGS = {"nixl": {"device": "cpu"}, "mooncake": {"device": "cpu"}}


# ---------------------------------------------------------------------------------------------
# The model


def model_specs(preset: str, layers: int | None) -> list[tuple[str, tuple[int, ...]]]:
    import ferry
    specs = [(name, tuple(shape))
             for name, _dtype, shape in ferry.hf_tensor_specs(preset, ferry.DType.BF16)]
    if layers is None:
        return specs
    keep = []
    for name, shape in specs:
        m = re.search(r"\.layers\.(\d+)\.", name)
        if m is None or int(m.group(1)) < layers:
            keep.append((name, shape))
    return keep


def tensor_hash(t: torch.Tensor) -> str:
    return hashlib.blake2b(t.contiguous().view(-1).view(torch.uint8).numpy(),
                           digest_size=16).hexdigest()


# ---------------------------------------------------------------------------------------------
# The CPU stand-ins of `nixl+cpu` and `mooncake+cpu`


class _StatelessProcessGroup:
    """The part of vllm's StatelessProcessGroup that verl's mooncake engine uses (create,
    send_obj, recv_obj, all_gather_obj), on torch's TCPStore as vllm's is."""

    def __init__(self, rank: int, world_size: int, store) -> None:
        self.rank, self.world_size, self.store = rank, world_size, store
        self.sent: dict[int, int] = {}
        self.received: dict[int, int] = {}
        self.gathers = 0

    @classmethod
    def create(cls, host: str, port: int, rank: int, world_size: int,
               data_expiration_seconds: int = 3600, store_timeout: int = 300):
        import datetime
        from torch.distributed import TCPStore
        store = TCPStore(host_name=host, port=port, world_size=world_size,
                         is_master=(rank == 0), timeout=datetime.timedelta(seconds=store_timeout))
        return cls(rank, world_size, store)

    def send_obj(self, obj, dst: int) -> None:
        import pickle
        n = self.sent.get(dst, 0)
        self.store.set(f"send/{self.rank}/{dst}/{n}", pickle.dumps(obj))
        self.sent[dst] = n + 1

    def recv_obj(self, src: int):
        import pickle
        n = self.received.get(src, 0)
        key = f"send/{src}/{self.rank}/{n}"
        obj = pickle.loads(self.store.get(key))
        self.store.delete_key(key)
        self.received[src] = n + 1
        return obj

    def all_gather_obj(self, obj) -> list:
        import pickle
        n = self.gathers
        self.gathers += 1
        self.store.set(f"gather/{n}/{self.rank}", pickle.dumps(obj))
        return [pickle.loads(self.store.get(f"gather/{n}/{r}")) for r in range(self.world_size)]


def _import_shims(peer: str) -> None:
    """Before verl.checkpoint_engine is imported: mooncake's StatelessProcessGroup."""
    if peer != "mooncake":
        return
    for name in ("sglang", "sglang.srt", "sglang.srt.distributed", "sglang.srt.distributed.utils"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = module
    sys.modules["sglang.srt.distributed.utils"].StatelessProcessGroup = _StatelessProcessGroup


def _runtime_shims(peer: str) -> None:
    """In a rank's process, after the import: what verl's engine needs of CUDA, on CPU."""
    if peer == "nixl":
        zeros = torch.zeros

        def zeros_unpinned(*args, **kwargs):
            if kwargs.get("pin_memory") and not torch.cuda.is_available():
                kwargs.pop("pin_memory")
            return zeros(*args, **kwargs)

        torch.zeros = zeros_unpinned
        torch.cuda.synchronize = lambda *a, **k: None
    elif peer == "mooncake":
        os.environ["MC_FORCE_TCP"] = "1"
        module = sys.modules["verl.checkpoint_engine.mooncake_checkpoint_engine"]
        cpu = types.SimpleNamespace(device_count=lambda: 1, set_device=lambda *a: None,
                                    synchronize=lambda *a: None, empty_cache=lambda: None)
        module.get_torch_device = lambda: cpu


def backend_class(backend: str):
    """verl's registry entry for `backend` (`peer` or `peer+cpu`), its import done as verl's
    CheckpointEngineWorker does (custom_backend_module for ferry)."""
    peer, _, variant = backend.partition("+")
    if variant == "cpu":
        _import_shims(peer)
        if peer in SHIMS:  # by name: verl.checkpoint_engine notes a failed import, goes on
            importlib.import_module(f"verl.checkpoint_engine.{peer}_checkpoint_engine")
    if peer == "ferry":
        importlib.import_module("ferry.verl.checkpoint_engine")
    from verl.checkpoint_engine import CheckpointEngineRegistry
    return CheckpointEngineRegistry.get(peer)  # names the failed import if there was one


# ---------------------------------------------------------------------------------------------
# A rank: one process, driven over a pipe


def _rank_main(conn, role: str, index: int, backend: str, bucket_bytes: int,
               engine_kwargs: dict, specs: list, seed: int, log_path: str | None) -> None:
    if log_path:  # the peers' own logging (NIXL, glog, cupy's nccl notice) out of the table
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    try:
        _rank_loop(conn, role, index, backend, bucket_bytes, engine_kwargs, specs, seed)
    except BaseException:  # noqa: BLE001 - reported to the driver, whatever it is
        try:
            conn.send(("error", traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass


def _rank_loop(conn, role: str, index: int, backend: str, bucket_bytes: int,
               engine_kwargs: dict, specs: list, seed: int) -> None:
    os.environ["RANK"] = str(index)  # as in verl's workers (mooncake's constructor reads it)
    peer, _, variant = backend.partition("+")
    cls = backend_class(backend)
    if variant == "cpu":
        _runtime_shims(peer)
    torch.set_grad_enabled(False)
    # The trainer's weights, or the rollout's resident model (written once before timing:
    # a rollout's model is resident when verl updates it).
    if role == "trainer":
        g = torch.Generator().manual_seed(seed)
        model = {n: torch.empty(s, dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
                 for n, s in specs}
        engine = cls(bucket_size=bucket_bytes, is_master=True, **engine_kwargs)
    else:
        model = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in specs}
        engine = cls(bucket_size=bucket_bytes, **engine_kwargs)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    conn.send(("ok", None))

    async def receive(step: int) -> dict:
        count, seen, unknown = 0, set(), []
        async for name, tensor in engine.receive_weights(global_steps=step):
            count += 1
            seen.add(name)
            if name in model:
                model[name].copy_(tensor.view(model[name].shape))  # vLLM's load_weights
            else:
                unknown.append(name)
        return {"tensors": count, "distinct": len(seen), "unknown": unknown[:3]}

    while True:
        cmd, arg = conn.recv()
        if cmd == "prepare":
            conn.send(("ok", engine.prepare()))
        elif cmd == "topology":  # the manager's classmethod call, on this process's class
            conn.send(("ok", cls.build_topology(*arg)))
        elif cmd == "init":
            engine.init_process_group(**arg)
            conn.send(("ok", None))
        elif cmd == "update":
            t0 = time.perf_counter()
            if role == "trainer":
                metrics = loop.run_until_complete(engine.send_weights(
                    ((n, t) for n, t in model.items()), global_steps=arg))
                out = {"metrics": metrics if isinstance(metrics, dict) else {}}
            else:
                out = loop.run_until_complete(receive(arg))
            out["seconds"] = time.perf_counter() - t0
            conn.send(("ok", out))
        elif cmd == "finalize":
            engine.finalize()
            conn.send(("ok", None))
        elif cmd == "change":  # the trainer's next version of every tensor (untimed)
            for t in model.values():
                flat = t.view(-1)
                flat[0] = float(arg) + 0.5
                flat[-1] = -float(arg) - 0.25
            conn.send(("ok", None))
        elif cmd == "hash":
            conn.send(("ok", {n: tensor_hash(t) for n, t in model.items()}))
        elif cmd == "exit":
            if hasattr(engine, "close"):
                engine.close()
            conn.send(("ok", None))
            return


# ---------------------------------------------------------------------------------------------
# The driver: verl's CheckpointEngineManager, without Ray


class RankError(RuntimeError):
    pass


class Ranks:
    def __init__(self, backend: str, bucket_bytes: int, engine_kwargs: dict, specs: list,
                 rollouts: int, timeout: float, log_path: str | None) -> None:
        ctx = mp.get_context("spawn")
        self.timeout = timeout
        self.names = ["trainer"] + [f"rollout {i}" for i in range(rollouts)]
        self.conns, self.procs = [], []
        for i, name in enumerate(self.names):
            parent, child = ctx.Pipe()
            role = "trainer" if i == 0 else "rollout"
            proc = ctx.Process(target=_rank_main, daemon=True,
                               args=(child, role, 0 if i == 0 else i - 1, backend, bucket_bytes,
                                     engine_kwargs, specs, 0, log_path))
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self.gather(range(len(self.names)), "start (import, constructor)")

    def send(self, i: int, cmd: str, arg=None) -> None:
        self.conns[i].send((cmd, arg))

    def gather(self, which, phase: str) -> list:
        """Every rank's reply, in rank order; the first error (or a timeout, or a rank that
        died) raises RankError naming the rank and the phase."""
        which = list(which)
        pending = {self.conns[i]: i for i in which}
        replies = {}
        deadline = time.monotonic() + self.timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                names = ", ".join(self.names[i] for i in pending.values())
                raise RankError(f"{phase}: no reply from {names} within {self.timeout:.0f} s")
            for conn in mp.connection.wait(list(pending), timeout=min(left, 1.0)):
                i = pending.pop(conn)
                try:
                    status, value = conn.recv()
                except (EOFError, OSError):
                    raise RankError(f"{phase}: {self.names[i]} died (exit code "
                                    f"{self.procs[i].exitcode})") from None
                if status == "error":
                    raise RankError(f"{phase}: {self.names[i]}:\n{value}")
                replies[i] = value
        return [replies[i] for i in which]

    def all(self, cmd: str, phase: str, args: list | None = None) -> list:
        for i in range(len(self.conns)):
            self.send(i, cmd, None if args is None else args[i])
        return self.gather(range(len(self.conns)), phase)

    def close(self, clean: bool) -> None:
        if clean:
            try:
                self.all("exit", "exit")
            except RankError:
                pass
        for proc in self.procs:
            proc.join(5 if clean else 0.5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()


def run_backend(backend: str, bucket_mb: int, specs: list, updates: int, rollouts: int,
                engine_kwargs: dict, timeout: float, verify: bool,
                log_path: str | None = None) -> dict:
    total = sum(torch.Size(s).numel() * 2 for _, s in specs)
    out = {"backend": backend, "bucket_mb": bucket_mb, "bytes": total, "updates": [],
           "verified": None, "error": None}
    ranks = None
    clean = False
    try:
        ranks = Ranks(backend, bucket_mb << 20, engine_kwargs, specs, rollouts, timeout,
                      log_path)
        trainer_hashes = None
        mismatches = []
        for step in range(updates):
            ranks.send(0, "change", step + 1)
            ranks.gather([0], "change")
            t0 = time.perf_counter()
            metadata = ranks.all("prepare", f"update {step}: prepare")
            ranks.send(0, "topology", (1, rollouts, metadata))
            trainer_kw, rollout_kw = ranks.gather([0], f"update {step}: build_topology")[0]
            per_rank = []
            for kw, i in [(trainer_kw, 0)] + [(rollout_kw, r) for r in range(rollouts)]:
                per_rank.append({k: v[i] for k, v in kw.items() if k != "method"})
            ranks.all("init", f"update {step}: init_process_group", per_rank)
            t1 = time.perf_counter()
            for i in list(range(1, rollouts + 1)) + [0]:
                ranks.send(i, "update", step)
            replies = ranks.gather(range(rollouts + 1), f"update {step}: send/receive_weights")
            t2 = time.perf_counter()
            ranks.all("finalize", f"update {step}: finalize")
            t3 = time.perf_counter()
            record = {"seconds": t3 - t0, "setup_s": t1 - t0, "transfer_s": t2 - t1,
                      "finalize_s": t3 - t2,
                      "received": [r["tensors"] for r in replies[1:]]}
            metrics = replies[0].get("metrics") or {}
            record["metrics"] = {k: v for k, v in metrics.items()
                                 if isinstance(v, (int, float, str, bool))}
            for r, reply in enumerate(replies[1:]):
                if reply["distinct"] != len(specs) or reply["tensors"] != len(specs):
                    mismatches.append(f"update {step}: rollout {r} was handed {reply['tensors']} "
                                      f"tensors, {reply['distinct']} distinct, of {len(specs)}")
                if reply["unknown"]:
                    mismatches.append(f"update {step}: rollout {r} got unknown tensors "
                                      f"{reply['unknown']}")
            if verify:
                hashes = ranks.all("hash", f"update {step}: hash")
                trainer_hashes = hashes[0]
                for r, got in enumerate(hashes[1:]):
                    bad = [n for n in trainer_hashes if got.get(n) != trainer_hashes[n]]
                    if bad:
                        mismatches.append(f"update {step}: rollout {r}: {len(bad)} of "
                                          f"{len(trainer_hashes)} tensors differ from the "
                                          f"trainer's (first: {bad[0]})")
            out["updates"].append(record)
        if verify:
            out["verified"] = "ok" if not mismatches else "MISMATCH"
        out["mismatches"] = mismatches[:10]
        clean = True
    except Exception as e:  # noqa: BLE001 - reported, the run goes on with the others
        text = str(e) if isinstance(e, RankError) else traceback.format_exc()
        out["error"] = text.strip()
    finally:
        if ranks is not None:
            ranks.close(clean)
    return out


def run_memcpy(total: int, rounds: int) -> float:
    src = torch.empty(total, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src).fill_(0)
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _error_parts(text: str) -> tuple[str, list[str], str]:
    """(phase line, the exception's lines, where it was raised) of a RankError's text."""
    rows = text.strip().splitlines()
    head = rows[0] if rows and not rows[0].startswith("Traceback") else ""
    starts = [i for i, row in enumerate(rows) if row.startswith("Traceback")]
    if not starts:
        return head, rows[1:] if head else rows, ""
    frames = [row.strip() for row in rows[starts[-1]:] if row.strip().startswith("File ")]
    exc_start = next((i for i in range(starts[-1] + 1, len(rows))
                      if rows[i] and not rows[i].startswith(" ")), len(rows) - 1)
    where = re.sub(r'File ".*?(site-packages|python)/', 'File "', frames[-1]) if frames else ""
    return head, rows[exc_start:], where


def short_error(text: str, lines: int = 4) -> str:
    """The phase, the exception's first lines and where it was raised."""
    head, exc, where = _error_parts(text)
    return "\n".join(([head] if head else []) + exc[:lines] + ([f"  at {where}"] if where else []))


def exc_line(text: str) -> str:
    head, exc, _ = _error_parts(text)
    return (exc[0] if exc else head).strip()


def versions() -> dict:
    from importlib import metadata
    out = {"python": sys.version.split()[0], "torch": torch.__version__}
    for dist in ("verl", "ray", "nixl", "nixl-cu12", "mooncake-transfer-engine-non-cuda",
                 "mooncake-transfer-engine", "cupy-cuda12x", "pyzmq"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        import ferry
        out["ferry"] = getattr(ferry, "__version__", "?")
    except ImportError:
        pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None,
                        help="keep the first N decoder layers (a smaller run)")
    parser.add_argument("--backends", default="ferry,nixl,mooncake,nixl+cpu,mooncake+cpu",
                        help="verl backend names; `+cpu`: with the CPU stand-ins (SHIMS)")
    parser.add_argument("--bucket-mb", default="512,64",
                        help="update_weights_bucket_megabytes, comma-separated")
    parser.add_argument("--updates", type=int, default=4,
                        help="updates per backend and bucket size (the first reported apart)")
    parser.add_argument("--passes", type=int, default=2,
                        help="passes over the backends per bucket size, in alternating order "
                             "(each a new set of processes; its first update reported apart)")
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--engine-kwargs", default=None,
                        help='JSON {backend: {kwarg: value}}, replacing the defaults '
                             f"{json.dumps(DEFAULT_ENGINE_KWARGS)}")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds any one phase of a backend may take before it is failed")
    parser.add_argument("--no-verify", action="store_true", help="skip the per-tensor hashes")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--rank-output", action="store_true",
                        help="leave the ranks' stdout/stderr on this terminal (default: one log "
                             "file per backend and bucket size in a temporary folder, named)")
    args = parser.parse_args()
    # nixl's prepare() metadata is a verl dataclass: unpickling it here imports verl's engines,
    # and cupy then warns that it has no NCCL (nothing here uses NCCL).
    warnings.filterwarnings("ignore", module="cupy._environment")
    backends = [b for b in args.backends.split(",") if b]
    buckets = [int(b) for b in args.bucket_mb.split(",") if b]
    engine_kwargs = DEFAULT_ENGINE_KWARGS if args.engine_kwargs is None \
        else json.loads(args.engine_kwargs)

    specs = model_specs(args.preset, args.layers)
    total = sum(torch.Size(s).numel() * 2 for _, s in specs)
    env = versions()
    layers = "" if args.layers is None else f", first {args.layers} layers"
    print(f"{args.preset}{layers}: {len(specs)} tensors, {total / 1e9:.3f} GB bf16; 1 trainer -> "
          f"{args.rollouts} rollouts; {args.updates} updates per backend and bucket")
    print("  " + ", ".join(f"{k} {v}" for k, v in env.items()))

    log_dir = None if args.rank_output else tempfile.mkdtemp(prefix="verl-peers-")
    if log_dir:
        print(f"  ranks' own output: {log_dir}/")
    results, memcpy = [], {}
    for bucket in buckets:
        runs: dict[str, list] = {b: [] for b in backends}
        copies = []
        for p in range(args.passes):
            # Passes alternate the backends' order, so that a load that drifts during the run
            # (the machine is shared) weighs on each alike.
            copies.append(run_memcpy(total, 3))
            print(f"bucket {bucket} MiB, pass {p + 1}/{args.passes}: memcpy of the same bytes "
                  f"{copies[-1]:.3f} s ({total / copies[-1] / 1e9:.2f} GB/s)", flush=True)
            for backend in (backends if p % 2 == 0 else backends[::-1]):
                if any(r["error"] for r in runs[backend]):
                    continue  # failed in an earlier pass: reported once
                peer = backend.partition("+")[0]
                t0 = time.perf_counter()
                log_path = None if log_dir is None else \
                    os.path.join(log_dir, f"{backend.replace('+', '-')}-{bucket}-{p}.log")
                r = run_backend(backend, bucket, specs, args.updates, args.rollouts,
                                engine_kwargs.get(peer, {}), args.timeout, not args.no_verify,
                                log_path)
                runs[backend].append(r)
                if r["error"]:
                    done = f" ({len(r['updates'])} updates done)" if r["updates"] else ""
                    print(f"  {backend:13s} FAILED after {time.perf_counter() - t0:.1f} s{done}:")
                    print("    " + short_error(r["error"]).replace("\n", "\n    "), flush=True)
                else:
                    times = [u["seconds"] for u in r["updates"]]
                    print(f"  {backend:13s} updates {', '.join(f'{t:.2f}' for t in times)} s; "
                          f"bytes {r['verified'] or 'not verified'}", flush=True)
                    for m in r.get("mismatches", []):
                        print(f"    {m}")
        memcpy[bucket] = statistics.median(copies)
        for backend in backends:
            passes = runs[backend]
            firsts = [r["updates"][0] for r in passes if r["updates"]]
            later = [u for r in passes for u in r["updates"][1:]]
            verified = [r["verified"] for r in passes if r["verified"]]
            results.append({
                "backend": backend, "bucket_mb": bucket, "bytes": total, "memcpy_s": memcpy[bucket],
                "passes": passes, "error": next((r["error"] for r in passes if r["error"]), None),
                "verified": None if not verified else
                "ok" if all(v == "ok" for v in verified) else "MISMATCH",
                "first_s": statistics.median(u["seconds"] for u in firsts) if firsts else None,
                "later_s": statistics.median(u["seconds"] for u in later) if later else None,
                "later_transfer_s":
                    statistics.median(u["transfer_s"] for u in later) if later else None})

    # Summary: ratios within each bucket size.
    for r in results:
        r["gbps"] = total / r["later_s"] / 1e9 if r["later_s"] else None
        r["vs_memcpy"] = r["memcpy_s"] / r["later_s"] if r["later_s"] else None
    for r in results:
        ferry_r = next((f for f in results if f["backend"] == "ferry"
                        and f["bucket_mb"] == r["bucket_mb"] and f["gbps"]), None)
        r["vs_ferry"] = r["gbps"] / ferry_r["gbps"] if r["gbps"] and ferry_r else None

    print()
    print("| backend | bucket MiB | first update s | later s (median) | its send/receive s "
          "| GB/s | / ferry | / memcpy | bytes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        if r["error"] and not r["later_s"]:
            print(f"| {r['backend']} | {r['bucket_mb']} | failed: {exc_line(r['error'])[:100]} "
                  "| | | | | | |")
            continue
        f = lambda v, fmt: "" if v is None else format(v, fmt)  # noqa: E731
        print(f"| {r['backend']} | {r['bucket_mb']} | {f(r['first_s'], '.3f')} | "
              f"{f(r['later_s'], '.3f')} | {f(r['later_transfer_s'], '.3f')} | "
              f"{f(r['gbps'], '.2f')} | {f(r['vs_ferry'], '.3f')} | {f(r['vs_memcpy'], '.3f')} | "
              f"{r['verified'] or 'not verified'}{' (then failed)' if r['error'] else ''} |")
    used = sorted({b.partition("+")[0] for b in backends if b.endswith("+cpu")})
    for peer in used:
        print(f"\n{peer}+cpu stand-ins (SHIMS): " + "; ".join(SHIMS.get(peer, [])))

    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"preset": args.preset, "layers": args.layers, "tensors": len(specs),
                       "bytes": total, "rollouts": args.rollouts, "updates": args.updates, "passes": args.passes,
                       "versions": env, "memcpy_s": memcpy, "results": results,
                       "shims": {p: SHIMS[p] for p in used if p in SHIMS}}, fh, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A Qwen2.5-0.5B-shaped bf16 state dict through ferry.verl, beside the C++ engine, same run.

    PYTHONPATH=build/python .venv/bin/python bench/python_sync.py [--rounds 5] [--bucket-mb 64]
        [--paths memcpy,cpp,buckets,verl,verl128,backend]

Paths, each trainer process -> a spawned rollout process, one copy on each side:
  cpp     ferry.Sender.send_round -> Receiver.receive_round_into (destinations filled by C++)
  stream  ferry.Sender.send_round_streamed (each tensor pulled from a Python generator as the
          ring has room, the GIL taken per pull) -> receive_round_into: what streaming costs
  verl    ferry.verl.BucketedWeightSender.async_send_weights(generator) ->
          BucketedWeightReceiver.receive_weights(cb), cb copying each tensor into the model
  verl128 the same with round_bytes = 128 MiB: the update streamed as 8 rounds (the default,
          1 GiB, sends this model in one)
  buckets ferry.Sender -> ferry.Receiver.receive_round_buckets(cb), the same cb as verl's
  backend the checkpoint engine (ferry.verl.checkpoint_engine), colocated: verl's manager
          sequence per update (prepare -> build_topology -> init_process_group -> send_weights
          beside receive_weights, its tensors copied into the model -> finalize); timed whole.
          The first update (new session: ring, sockets, join; staged, it teaches the
          manifest) is reported apart; later ones stream. --device cuda:N puts both ends'
          tensors on that device and gives the engines engine_kwargs.ferry.device, the
          device path: D2H into the ring, H2D from it (bench/device_check.sh)
  memcpy  one torch copy of the same bytes in one process (the machine's limit)
and the C++ engine alone (`ferry bench sync --json`) in both delivery modes: destinations
(against cpp) and `--bucket-callback` (against buckets and verl, which deliver the same way).
Figures: median GB/s (1e9 bytes/s) of the timed rounds after one warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import time
import uuid

import torch

import ferry
from ferry import verl


def state_dict(preset: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, _dtype, shape in ferry.hf_tensor_specs(preset, ferry.DType.BF16):
        out[name] = torch.empty(shape, dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
    return out


def _cpp_receiver(address: str, preset: str, rounds: int, ready, buckets: bool = False) -> None:
    model = {n: torch.empty(s, dtype=torch.bfloat16)
             for n, _, s in ferry.hf_tensor_specs(preset, ferry.DType.BF16)}
    receiver = ferry.Receiver(address, 0, timeout=120)
    receiver.set_destinations(model)

    def load(weights, is_last):
        for name, tensor in weights:
            model[name].copy_(tensor)

    ready.put("ok")
    for _ in range(rounds):
        if buckets:
            receiver.receive_round_buckets(load)
        else:
            receiver.receive_round_into()
    receiver.close()


def _verl_receiver(handle: str, preset: str, rounds: int, ready) -> None:
    model = {n: torch.empty(s, dtype=torch.bfloat16)
             for n, _, s in ferry.hf_tensor_specs(preset, ferry.DType.BF16)}

    def load(weights, is_last):  # what vLLM's load_weights does with each bucket
        for name, tensor in weights:
            model[name].copy_(tensor)

    ready.put("ok")
    for _ in range(rounds):
        verl.BucketedWeightReceiver(handle, torch.device("cpu"), use_shm=True).receive_weights(load)


def run_cpp(weights: dict, preset: str, rounds: int, bucket_mb: int,
            buckets: bool = False, streamed: bool = False) -> list[float]:
    address = f"@ferry-bench-{uuid.uuid4().hex[:12]}"
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    proc = ctx.Process(target=_cpp_receiver, args=(address, preset, rounds + 1, ready, buckets))
    proc.start()
    times = []
    with ferry.Sender(address, bucket_bytes=bucket_mb << 20, timeout=120) as sender:
        sender.accept(1)
        ready.get(timeout=120)
        items = list(weights.items())
        specs = [(n, t.dtype, tuple(t.shape)) for n, t in items]
        for _ in range(rounds + 1):
            t0 = time.perf_counter()
            if streamed:
                sender.send_round_streamed(specs, (item for item in items))
            else:
                sender.send_round(items)
            times.append(time.perf_counter() - t0)
    proc.join(120)
    return times[1:]


def run_verl(weights: dict, preset: str, rounds: int, bucket_mb: int,
             round_bytes: int | None = None) -> list[float]:
    handle = f"ipc:///tmp/ferry-bench-{uuid.uuid4().hex}.sock"
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    proc = ctx.Process(target=_verl_receiver, args=(handle, preset, rounds + 1, ready))
    proc.start()
    ready.get(timeout=120)
    times = []
    for _ in range(rounds + 1):
        sender = verl.BucketedWeightSender(handle, bucket_size_mb=bucket_mb, use_shm=True,
                                           round_bytes=round_bytes)
        t0 = time.perf_counter()
        asyncio.run(sender.async_send_weights((n, t) for n, t in weights.items()))
        times.append(time.perf_counter() - t0)
    verl.close_sessions()
    proc.join(120)
    return times[1:]


def _backend_rollout(conn, preset: str, bucket_bytes: int, device: str = "cpu") -> None:
    """One rollout rank of the checkpoint engine: runs the manager calls it is sent."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    # Written once before timing starts: a rollout's model is resident when verl updates it
    # (untouched, its first-touch page faults were ~4 s of the first update on a VM).
    model = {n: torch.zeros(s, dtype=torch.bfloat16, device=device)
             for n, _, s in ferry.hf_tensor_specs(preset, ferry.DType.BF16)}
    engine = FerryCheckpointEngine(bucket_bytes, device=device)
    conn.send("ready")  # the first update is timed from here: process start-up is no part of it

    async def receive() -> None:
        async for name, tensor in engine.receive_weights():
            model[name].copy_(tensor)  # what vLLM's load_weights does

    while True:
        cmd, *args = conn.recv()
        if cmd == "prepare":
            conn.send(engine.prepare())
        elif cmd == "init":
            engine.init_process_group(**args[0])
            conn.send("ok")
        elif cmd == "receive":
            asyncio.run(receive())
            conn.send("ok")
        else:
            engine.close()
            conn.send("ok")
            return


def run_backend(weights: dict, preset: str, rounds: int, bucket_mb: int,
                device: str = "cpu") -> list[float]:
    """Seconds of each update through the checkpoint engine, the first (new session) first.
    Prints where the later updates' time goes: the manager's calls around send_weights,
    send_weights itself (generator included) and its transfer (ferry/shm_seconds)."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    weights = {n: t.to(device) for n, t in weights.items()}
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_backend_rollout, args=(child, preset, bucket_mb << 20, device))
    proc.start()
    master = FerryCheckpointEngine(bucket_mb << 20, is_master=True, device=device)
    assert conn.recv() == "ready"
    times, metrics = [], []
    for step in range(rounds + 1):
        t0 = time.perf_counter()
        conn.send(("prepare",))
        trainer_kw, rollout_kw = FerryCheckpointEngine.build_topology(
            1, 1, [master.prepare(), conn.recv()])
        conn.send(("init", {k: v[0] for k, v in rollout_kw.items()}))
        master.init_process_group(**{k: v[0] for k, v in trainer_kw.items()})
        assert conn.recv() == "ok"
        conn.send(("receive",))
        metrics.append(asyncio.run(master.send_weights(((n, t) for n, t in weights.items()),
                                                       global_steps=step)))
        assert conn.recv() == "ok"
        master.finalize()
        times.append(time.perf_counter() - t0)
    conn.send(("exit",))
    conn.recv()
    master.close()
    proc.join(120)
    later = metrics[1:]
    if later:
        update = statistics.median(times[1:])
        call = statistics.median(m["ferry/seconds"] for m in later)
        transfer = statistics.median(m["ferry/shm_seconds"] for m in later)
        streamed = sum(m["ferry/streamed"] for m in later)
        print(f"  backend later updates (median): {update * 1e3:.0f} ms whole = send_weights "
              f"{call * 1e3:.0f} ms (its transfer {transfer * 1e3:.0f} ms; streamed "
              f"{streamed:.0f} of {len(later)}) + manager calls and the rollout's last "
              f"bucket {(update - call) * 1e3:.0f} ms")
    return times


def run_memcpy(total: int, rounds: int) -> list[float]:
    src = torch.empty(total, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    times = []
    for _ in range(rounds + 1):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return times[1:]


def run_cli(binary: str, preset: str, bucket_mb: int, rounds: int, *extra: str) -> str:
    if not os.path.exists(binary):
        return f"n/a ({binary} not built)"
    cmd = [binary, "bench", "sync", "--preset", preset, "--bucket-mb", str(bucket_mb),
           "--receivers", "1", "--dtype", "bf16", "--rounds", str(rounds), "--json", *extra]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "n/a (timed out)"
    if out.returncode != 0:
        return f"n/a (`{' '.join(cmd[1:])}`: {(out.stderr or out.stdout).strip()[:120]})"
    try:
        return json.dumps(json.loads(out.stdout))[:1500]
    except ValueError:
        return out.stdout.strip()[:600]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--ferry", default="build/src/cli/ferry", help="the ferry CLI")
    parser.add_argument("--device", default="cpu",
                        help="torch device of the backend path's tensors on both ends, and "
                             "its engine_kwargs.ferry.device (the device path)")
    parser.add_argument("--paths", default="memcpy,cpp,stream,buckets,verl,verl128,backend",
                        help="comma-separated paths to run (see above)")
    args = parser.parse_args()
    paths = args.paths.split(",")

    weights = state_dict(args.preset)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    print(f"{args.preset}: {len(weights)} tensors, {total / 1e9:.3f} GB bf16, "
          f"bucket {args.bucket_mb} MiB, {args.rounds} timed rounds")
    results = {}
    first_update = None
    for name, run in (("memcpy", lambda: run_memcpy(total, args.rounds)),
                      ("cpp", lambda: run_cpp(weights, args.preset, args.rounds, args.bucket_mb)),
                      ("stream", lambda: run_cpp(weights, args.preset, args.rounds,
                                                 args.bucket_mb, streamed=True)),
                      ("buckets", lambda: run_cpp(weights, args.preset, args.rounds,
                                                  args.bucket_mb, buckets=True)),
                      ("verl", lambda: run_verl(weights, args.preset, args.rounds,
                                                args.bucket_mb)),
                      # The update streamed in small rounds: what each round boundary costs.
                      ("verl128", lambda: run_verl(weights, args.preset, args.rounds,
                                                   args.bucket_mb, round_bytes=128 << 20)),
                      ("backend", lambda: run_backend(weights, args.preset, args.rounds,
                                                      args.bucket_mb, args.device))):
        if name not in paths:
            continue
        times = run()
        if name == "backend":  # its first update builds the session: reported apart
            first_update, times = times[0], times[1:]
        results[name] = total / statistics.median(times) / 1e9
        print(f"  {name:7s} {results[name]:6.2f} GB/s   (median of "
              f"{', '.join(f'{t * 1e3:.0f}' for t in times)} ms)")
    for a, b, label in (("verl", "cpp", "verl / cpp"), ("verl", "buckets", "verl / buckets"),
                        ("verl128", "verl", "verl in 128 MiB rounds / verl"),
                        ("cpp", "memcpy", "cpp / memcpy"), ("stream", "cpp", "stream / cpp"),
                        ("backend", "cpp", "backend / cpp")):
        if a in results and b in results:
            print(f"  {label} = {results[a] / results[b]:.3f}")
    if first_update is not None:
        later = total / results["backend"] / 1e9
        print(f"  backend first update (new session): {first_update:.3f} s; later updates "
              f"(median): {later:.3f} s; first / later = {first_update / later:.2f}")
    # The C++ engine in each delivery mode: destinations (cpp's and the backend's, which
    # copies every tensor into the model) and the per-bucket callback that verl's API
    # imposes (buckets' and verl's), each compared like for like.
    for mode, extra, python_paths in (("destinations", (), ("cpp", "stream", "backend")),
                                      ("bucket callback", ("--bucket-callback",),
                                       ("buckets", "verl"))):
        python_paths = tuple(p for p in python_paths if p in results)
        if not python_paths:
            continue
        cli = run_cli(args.ferry, args.preset, args.bucket_mb, args.rounds, *extra)
        print(f"  ferry bench sync ({mode}): {cli}")
        try:
            cli_gbps = json.loads(cli)["results"][0]["gbps"]
        except (ValueError, KeyError, IndexError, TypeError):
            continue
        ratios = ", ".join(f"{p} / C++ = {results[p] / cli_gbps:.3f}" for p in python_paths)
        print(f"  C++ CLI, {mode}: {cli_gbps:6.2f} GB/s; {ratios}")


if __name__ == "__main__":
    main()

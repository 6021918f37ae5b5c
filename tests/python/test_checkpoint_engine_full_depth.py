"""The verl checkpoint engine at real size: every tensor of qwen2.5-0.5b (290, 0.99 GB bf16),
128 MiB buckets (the 272 MB embedding spans three), a master and two rollout ranks in their
own processes, three updates in verl's manager order: the first staged, the later ones
streamed into the ring. Each rollout rank checks every byte against its own copy of what was
sent, and one of them writes into what it is given (verl's loaders may), which no later
update and no other rank may see."""

from __future__ import annotations

import asyncio

import pytest
import torch

import fake_device
import ferry
from conftest import new_process, processes
from vllm_reference import reference_slice

PRESET = "qwen2.5-0.5b"
# What the reference slicing needs of the preset's config (Qwen2.5-0.5B's config.json).
PRESET_HEADS = {"num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64}
BUCKET = 128 << 20
STEPS = 3
TIMEOUT_S = 300


def _base() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [(name, torch.empty(shape, dtype=torch.bfloat16).uniform_(-1, 1, generator=g))
            for name, _, shape in ferry.hf_tensor_specs(PRESET, ferry.DType.BF16)]


def _step_value(step: int) -> float:
    return 0.125 * step  # exact in bf16 beside values in [-1, 1): no two steps alike


def _rollout(conn, writes: bool, tp_size: int = 1) -> None:
    """A rollout rank: runs the manager's calls; per update answers the names received, the
    names whose bytes differ from base + step (with tp_size, from its slice of it, as the
    reference slicing cuts it) and the bytes it was given."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    base = dict(_base())
    local = {"tp_size": tp_size, "hf_config": PRESET} if tp_size > 1 else {}
    engine = FerryCheckpointEngine(BUCKET, **local)
    rank = [0]

    async def receive(step: int) -> tuple[list, list, int]:
        names, wrong, given = [], [], 0
        async for name, tensor, *spec in engine.receive_weights(global_steps=step):
            names.append(name)
            want = base[name] + _step_value(step)
            if tp_size > 1:
                want = reference_slice(name, want, PRESET_HEADS, rank[0] % tp_size, tp_size)
            if not torch.equal(tensor, want):
                wrong.append(name)
            given += tensor.numel() * tensor.element_size()
            if writes:
                tensor.fill_(-7.0)  # into the ring's pages: private to this rank and round
        return names, wrong, given

    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "prepare":
                out = engine.prepare()
            elif cmd == "init":
                rank[0] = args[0].get("rank", 0)
                out = engine.init_process_group(**args[0])
            elif cmd == "receive":
                out = asyncio.run(receive(args[0]))
            else:
                engine.close()
                conn.send(("ok", None))
                return
            conn.send(("ok", out))
        except Exception as e:  # reported to the test
            conn.send(("error", type(e).__name__, str(e)))


def _answer(conn) -> tuple:
    if not conn.poll(TIMEOUT_S):
        pytest.fail(f"a rollout rank gave no answer in {TIMEOUT_S} s")
    return conn.recv()


@pytest.mark.parametrize("tp_size,steps,master_device",
                         [(1, STEPS, "cpu"), (2, 2, "cpu"), (1, 2, "fake:0")])
def test_full_depth_model_updates_bit_exact_staged_then_streamed(tp_size, steps, master_device):
    """tp_size 2: the two rollout ranks are one tensor-parallel group (engine_kwargs.ferry
    tp_size, hf_config), each given only its slice of every tensor. master_device "fake:0":
    the master's device path (fake_device.py: copies land after they were started, so bytes
    hashed or sent before the update's flush waited for them would be wrong), staged into
    the staging buffer, then streamed into the ring."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    if master_device != "cpu":
        fake_device.use()
    base = _base()
    model_bytes = sum(t.numel() * 2 for _, t in base)
    conns, procs = [], []
    for writes in (False, True):
        conn, child = processes().Pipe()
        procs.append(new_process(_rollout, child, writes, tp_size, daemon=True))
        procs[-1].start()
        conns.append(conn)
    master = FerryCheckpointEngine(BUCKET, is_master=True, device=master_device)
    try:
        for step in range(1, steps + 1):
            for conn in conns:
                conn.send(("prepare",))
            metadata = [master.prepare()] + [_answer(c)[1] for c in conns]
            trainer_kw, rollout_kw = FerryCheckpointEngine.build_topology(1, 2, metadata)
            for i, conn in enumerate(conns):
                conn.send(("init", {k: v[i] for k, v in rollout_kw.items()}))
            master.init_process_group(**{k: v[0] for k, v in trainer_kw.items()})
            assert [_answer(c)[0] for c in conns] == ["ok", "ok"]
            for conn in conns:
                conn.send(("receive", step))
            sent = ((name, t + _step_value(step)) for name, t in base)  # a generator, as verl's
            metrics = asyncio.run(master.send_weights(sent, global_steps=step))
            received = [_answer(c) for c in conns]
            master.finalize()
            for rank, answer in enumerate(received):
                assert answer[0] == "ok", f"step {step}, rank {rank}: {answer}"
                names, wrong, given = answer[1]
                assert names == [n for n, _ in base], f"step {step}, rank {rank}: names"
                assert not wrong, f"step {step}, rank {rank}: wrong bytes for {wrong[:5]}"
                print(f"tp_size={tp_size} step {step}, rank {rank}: given {given} bytes, "
                      f"{given / model_bytes:.5f} of the model")
                if tp_size > 1:  # its slices: half but the replicated norms and biases
                    assert 0.5 <= given / model_bytes < 0.501, (step, rank, given)
            assert metrics["ferry/tensors"] == len(base) == 290
            assert metrics["ferry/bytes"] == sum(t.numel() * 2 for _, t in base)
            assert metrics["ferry/streamed"] == (0.0 if step == 1 else 1.0), (step, metrics)
            print(f"senders=1 tp_size={tp_size} step {step}: {metrics['ferry/seconds']:.2f} s")
    finally:
        for conn in conns:
            conn.send(("exit",))
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        master.close()


def _sender(conn) -> None:
    """A second actor rank (engine_kwargs.ferry.senders=2) in its own process: runs the
    manager's calls; sends base + step as the master does."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    base = _base()
    engine = FerryCheckpointEngine(BUCKET, senders=2)
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "prepare":
                out = engine.prepare()
            elif cmd == "init":
                out = engine.init_process_group(**args[0])
            elif cmd == "send":
                step = args[0]
                sent = ((name, t + _step_value(step)) for name, t in base)
                out = asyncio.run(engine.send_weights(sent, global_steps=step))
            else:
                engine.close()
                conn.send(("ok", None))
                return
            conn.send(("ok", out))
        except Exception as e:  # reported to the test
            conn.send(("error", type(e).__name__, str(e)))


def test_full_depth_model_from_two_senders_bit_exact_half_the_bytes_each():
    """engine_kwargs.ferry.senders=2: the master and a second actor rank each send about
    half of qwen2.5-0.5b's bytes (a disjoint part) to both rollout ranks, which get every one
    of the 290 tensors once and byte for byte, three updates (staged, then streamed)."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    base = _base()
    model = sum(t.numel() * 2 for _, t in base)
    conns, procs = [], []
    for target, args in ((_rollout, (False,)), (_rollout, (True,)), (_sender, ())):
        conn, child = processes().Pipe()
        procs.append(new_process(target, child, *args, daemon=True))
        procs[-1].start()
        conns.append(conn)
    rollouts, second = conns[:2], conns[2]
    master = FerryCheckpointEngine(BUCKET, is_master=True, senders=2)
    try:
        for step in range(1, STEPS + 1):
            for conn in (second, *rollouts):
                conn.send(("prepare",))
            second_meta = _answer(second)[1]
            metadata = [master.prepare(), second_meta] + [_answer(c)[1] for c in rollouts]
            trainer_kw, rollout_kw = FerryCheckpointEngine.build_topology(2, 2, metadata)
            assert trainer_kw["role"] == ["master", "sender"]
            for i, conn in enumerate(rollouts):
                conn.send(("init", {k: v[i] for k, v in rollout_kw.items()}))
            second.send(("init", {k: v[1] for k, v in trainer_kw.items()}))
            master.init_process_group(**{k: v[0] for k, v in trainer_kw.items()})
            assert [_answer(c)[0] for c in (second, *rollouts)] == ["ok"] * 3
            for conn in rollouts:
                conn.send(("receive", step))
            second.send(("send", step))
            sent = ((name, t + _step_value(step)) for name, t in base)  # a generator, as verl's
            metrics = asyncio.run(master.send_weights(sent, global_steps=step))
            other = _answer(second)
            received = [_answer(c) for c in rollouts]
            master.finalize()
            assert other[0] == "ok", other
            for rank, answer in enumerate(received):
                assert answer[0] == "ok", f"step {step}, rank {rank}: {answer}"
                names, wrong, _ = answer[1]
                assert len(names) == 290 and sorted(names) == sorted(n for n, _ in base), (
                    f"step {step}, rank {rank}: every tensor once")
                assert not wrong, f"step {step}, rank {rank}: wrong bytes for {wrong[:5]}"
            parts = [metrics["ferry/sender0/bytes"], other[1]["ferry/sender1/bytes"]]
            links = [metrics["ferry/sender0/shm_bytes"], other[1]["ferry/sender1/shm_bytes"]]
            seconds = [metrics["ferry/seconds"], other[1]["ferry/seconds"]]
            print(f"senders=2 step {step}: part bytes {parts}, link bytes {links}, "
                  f"seconds {seconds[0]:.2f} / {seconds[1]:.2f}")
            assert sum(parts) == model and metrics["ferry/bytes"] == model
            assert metrics["ferry/tensors"] == 290
            assert all(abs(p - model / 2) <= 0.01 * model / 2 for p in parts), parts
            assert links == [2 * p for p in parts], "each part once per rollout rank"
            for m in (metrics, other[1]):
                assert m["ferry/streamed"] == (0.0 if step == 1 else 1.0), (step, m)
    finally:
        for conn in conns:
            conn.send(("exit",))
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        master.close()

"""ferry.verl's device path (engine_kwargs.ferry.device, issue #17 item 3) on CPU, with a fake
device whose copies land late (fake_device.py): the master's device copies each tensor into the
staging buffer (a staged update) or the ring (a streamed one, ferry.sync.send_update's
`device`) and is waited for before the bytes are hashed and published; the rollout copies each bucket from the ring into
one of two device buffers and waits before yielding, while the caller reads the bucket before.

A master and a rollout engine run in this process (threads instead of verl's Ray workers),
through verl's sequence: prepare -> build_topology -> init_process_group -> send_weights beside
receive_weights -> finalize."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import fake_device
import ferry
from conftest import digest
from ferry.verl.checkpoint_engine import FerryCheckpointEngine

BUCKET = 1 << 20


def _weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """Mixed dtypes, one tensor (3 MiB) larger than the bucket, an empty one."""
    g = torch.Generator().manual_seed(step)
    out = [("model.embed_tokens.weight", torch.randn(1536, 1024, generator=g).to(torch.bfloat16))]
    for i in range(4):
        out.append((f"model.layers.{i}.q_proj.weight",
                    torch.randn(64, 96, generator=g).to(torch.bfloat16)))
        out.append((f"model.layers.{i}.norm.weight", torch.randn(96, generator=g)))
        out.append((f"model.layers.{i}.index", torch.randint(-9, 9, (17,), generator=g)))
    out.append(("model.empty", torch.empty(0, 8)))
    out.append(("lm_head.weight", torch.randn(300, 77, generator=g).half()))
    return out


def _bucket_weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """Ten 384 KiB tensors: two per 1 MiB bucket, five buckets."""
    g = torch.Generator().manual_seed(1000 + step)
    return [(f"model.layers.{i}.mlp.weight", torch.randn(96 * 1024, generator=g))
            for i in range(10)]


async def _digests(received) -> dict[str, str]:
    sums = {}
    async for name, tensor in received:
        sums[name] = digest(tensor)
        tensor.zero_()  # verl's loaders may write into what they were given
    return sums


class _Pair:
    """One master and one rollout engine of this process, colocated (shm)."""

    def __init__(self, **engine_kwargs) -> None:
        kwargs = {"device": "fake:0", "timeout_s": 20.0, **engine_kwargs}
        self.master = FerryCheckpointEngine(BUCKET, is_master=True, **kwargs)
        self.rollout = FerryCheckpointEngine(BUCKET, **kwargs)

    def update(self, step: int, weights: list, consume=_digests) -> tuple[dict, object]:
        metadata = [self.master.prepare(), self.rollout.prepare()]
        trainer_kw, rollout_kw = FerryCheckpointEngine.build_topology(1, 1, metadata)
        with ThreadPoolExecutor(2) as pool:
            inits = [pool.submit(engine.init_process_group, **{k: v[0] for k, v in kw.items()})
                     for engine, kw in ((self.master, trainer_kw), (self.rollout, rollout_kw))]
            for f in inits:
                f.result(timeout=60)
            sent = pool.submit(asyncio.run, self.master.send_weights(weights, global_steps=step))
            got = pool.submit(asyncio.run,
                              consume(self.rollout.receive_weights(global_steps=step)))
            results = [f.exception(timeout=60) or f.result() for f in (sent, got)]
        self.master.finalize()
        self.rollout.finalize()
        return results[0], results[1]

    def close(self) -> None:
        self.master.close()
        self.rollout.close()


def _expected(weights: list) -> dict[str, str]:
    return {name: digest(t) for name, t in weights}


def test_device_path_is_bit_exact_both_ways_and_registers_each_ring_once():
    device = fake_device.use(delay_s=0.0005)
    pair = _Pair()
    try:
        for step in (1, 2, 3):
            sent, received = pair.update(step, _weights(step))
            assert not isinstance(sent, BaseException), sent
            assert received == _expected(_weights(step)), step
            # From the second update on, the master's copies go straight into the ring.
            assert sent["ferry/streamed"] == (0.0 if step == 1 else 1.0)
        sender_rings = [r for r in device.registered if not r[2]]
        receiver_rings = [r for r in device.registered if r[2]]
        assert len(sender_rings) == 1 and len(receiver_rings) == 1  # once, not per update
        assert sender_rings[0][1] == receiver_rings[0][1] == 2 * BUCKET  # the whole ring
    finally:
        pair.close()
    # Both rings unregistered when the sessions closed (before they are unmapped).
    assert sorted(device.unregistered) == sorted(r[0] for r in device.registered)


def test_the_master_waits_for_its_copies_before_publishing_a_segment():
    fake_device.use(delay_s=0.005)  # each copy lands 5 ms after it was issued
    pair = _Pair()
    try:
        for step in (1, 2):  # step 1 staged, step 2 streamed: copies into the ring
            sent, received = pair.update(step, _weights(step))
            assert not isinstance(sent, BaseException), sent
            assert received == _expected(_weights(step))
    finally:
        pair.close()


def test_a_master_that_did_not_wait_would_be_caught():
    device = fake_device.use(delay_s=0.005, skip_waits="send")
    pair = _Pair()
    try:
        for step in (1, 2):  # staged, then (if the first got through) streamed
            sent, received = pair.update(step, _weights(step))
            # The bytes were hashed and published before they landed: a checksum mismatch,
            # or old bytes delivered.
            assert isinstance(sent, BaseException) or received != _expected(_weights(step))
    finally:
        device.drain()
        pair.close()


def test_the_rollout_waits_for_its_copies_before_yielding():
    fake_device.use(delay_s=0.005)
    pair = _Pair()
    try:
        sent, received = pair.update(1, _bucket_weights(1))
        assert received == _expected(_bucket_weights(1))
    finally:
        pair.close()


def test_a_rollout_that_did_not_wait_would_be_caught():
    device = fake_device.use(delay_s=0.005, skip_waits="receive")
    pair = _Pair()
    try:
        sent, received = pair.update(1, _bucket_weights(1))
        assert isinstance(received, BaseException) or received != _expected(_bucket_weights(1))
    finally:
        device.drain()
        pair.close()


def test_the_next_bucket_is_copied_while_the_caller_reads_the_current_one():
    device = fake_device.use(delay_s=0.001)
    expected = _expected(_bucket_weights(1))

    async def read_slowly(received) -> list[str]:
        """Holds each tensor until the next arrived and checks it only then (the lifetime
        receive_weights promises); logs when it took and finished each."""
        wrong, held = [], None
        async for name, tensor in received:
            device.note("took", name)
            if held is not None and digest(held[1]) != expected[held[0]]:
                wrong.append(held[0])
            time.sleep(0.03)
            device.note("done", name)
            held = (name, tensor)
        if digest(held[1]) != expected[held[0]]:
            wrong.append(held[0])
        return wrong

    pair = _Pair()
    try:
        sent, wrong = pair.update(1, _bucket_weights(1), read_slowly)
        assert wrong == []
    finally:
        pair.close()
    # Copies in flight (issued or landing) while the caller was on a tensor: those of a later
    # bucket, as the copies of a tensor's own bucket all landed before it was yielded.
    reading, overlapped = False, 0
    for entry in device.log:
        if entry[0] in ("took", "done"):
            reading = entry[0] == "took"
        elif entry[0] in ("issue", "land") and entry[2] == "receive" and reading:
            overlapped += 1
    assert overlapped > 0, device.log


@pytest.mark.parametrize("change, message", [
    (lambda w: w + [("model.extra", torch.ones(3))], "'model.extra' is one more than the 15"),
    (lambda w: w[:-1], "ended before tensor 14 'lm_head.weight'"),
    (lambda w: [(n, t.t() if n == "lm_head.weight" else t) for n, t in w],
     "tensor 14 is 'lm_head.weight' F16[77, 300], but the manifest has 'lm_head.weight' "
     "F16[300, 77]"),
])
def test_tensors_that_differ_from_the_manifest_abort_the_streamed_round_by_name(change, message):
    fake_device.use()
    pair = _Pair()
    try:
        pair.update(1, _weights(1))
        sent, received = pair.update(2, change(_weights(2)))
        assert isinstance(sent, ferry.InvalidArgumentError), sent
        assert message in str(sent)
        assert isinstance(received, BaseException)  # aborted before END: never delivered
        sent, received = pair.update(3, _weights(3))  # the sessions are rebuilt
        assert received == _expected(_weights(3))
    finally:
        pair.close()


def test_a_device_that_is_not_here_fails_at_construction_naming_it():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ferry.InvalidArgumentError, match="'cuda:0'.*no CUDA device"):
        FerryCheckpointEngine(BUCKET, is_master=True, device="cuda:0")
    with pytest.raises(ferry.InvalidArgumentError, match="'tpu:1'"):
        FerryCheckpointEngine(BUCKET, device="tpu:1")


def test_cpu_is_the_default_and_takes_the_host_path():
    engine = FerryCheckpointEngine(BUCKET)
    try:
        assert engine.device == "cpu" and engine._device_path is None
    finally:
        engine.close()

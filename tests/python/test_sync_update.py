"""ferry.sync's send_update: one call per update that streams against the last update's
manifest and stages (learning it anew) when it changed, bit-exact either way, from a
generator refilling one buffer; with several Senders fed by one iterator; from a coroutine."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

import ferry
import ferry.sync
from conftest import digest, unique_address
from weights import BUCKET_BYTES, from_one_buffer, make_weights


def _receive_updates(address: str, updates: int, out: list) -> threading.Thread:
    """A receiver thread: `updates` updates, each {name: digest} (the last of a name) with
    its rounds and step, or the exception that ended one."""
    def run() -> None:
        with ferry.Receiver(address, 0, timeout=30) as receiver:
            for _ in range(updates):
                got, rounds = {}, 0
                try:
                    while True:
                        stats = receiver.receive_round(
                            lambda name, t: got.__setitem__(name, digest(t)))
                        rounds += 1
                        if not stats.more_follows:
                            break
                    out.append((got, rounds, stats.step))
                except ferry.FerryError as e:
                    out.append(e)
                    return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _digests(weights) -> dict:
    return {name: digest(t) for name, t in weights}


def test_first_update_staged_then_streamed_bit_exact_from_one_buffer():
    address, got = unique_address(), []
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 3, got)
        sender.accept(1)
        assert sender.update_manifest is None
        for step in (1, 2, 3):
            weights = make_weights(step)
            stats = sender.send_update(from_one_buffer(weights), step=step,
                                       staging_bytes=1 << 20)
            assert stats.streamed == (step > 1), stats
            assert stats.tensors == len(weights)
            assert stats.bytes == sum(t.numel() * t.element_size() for _, t in weights)
            assert stats.rounds == (1 if step > 1 else stats.rounds) and stats.rounds >= 1
            manifest = sender.update_manifest
            assert [m[0] for m in manifest] == [n for n, _ in weights]
        thread.join(30)
    for step, (sums, rounds, sent_step) in zip((1, 2, 3), got):
        assert sums == _digests(make_weights(step)), step
        assert sent_step == step
    assert got[0][1] > 1, "1 MiB of staging: the first update took several rounds"
    assert got[1][1] == got[2][1] == 1


def test_a_manifest_changed_at_its_first_tensor_is_staged_correctly():
    address, got = unique_address(), []
    changed = [("new.first", torch.arange(10, dtype=torch.int32))] + make_weights(2)[1:]
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 3, got)
        sender.accept(1)
        sender.send_update(make_weights(1))
        assert not sender.send_update(iter(changed)).streamed
        assert sender.send_update(iter(changed)).streamed  # learned
        thread.join(30)
    assert got[1][0] == got[2][0] == _digests(changed)


def test_a_tensor_differing_mid_stream_fails_naming_it_and_the_next_update_stages():
    address, got = unique_address(), []
    weights = make_weights(1)
    renamed = [("other" if n == "norm.fp16" else n, t) for n, t in weights]
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 2, got)
        sender.accept(1)
        sender.send_update(weights)
        with pytest.raises(ferry.InvalidArgumentError,
                           match=r"tensor 1 is 'other' F16\[1000\], but the manifest has "
                                 r"'norm.fp16' F16\[1000\] there"):
            sender.send_update(renamed)
        assert sender.update_manifest is None
        thread.join(30)
    assert isinstance(got[1], ferry.FerryError), got[1]


def test_the_generators_exception_is_raised_unchanged():
    address, got = unique_address(), []

    def failing():
        yield from make_weights(1)[:3]
        raise KeyError("the trainer's generator failed")

    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 1, got)
        sender.accept(1)
        with pytest.raises(KeyError, match="the trainer's generator failed"):
            sender.send_update(failing())
        thread.join(30)


def test_one_async_generator_feeds_two_senders_streamed_the_second_time():
    addresses, got = [unique_address(), unique_address()], [[], []]

    async def generate(step: int):
        for name, tensor in from_one_buffer(make_weights(step)):
            await asyncio.sleep(0)  # runs on the loop, as verl's generators do
            yield name, tensor

    async def main(senders) -> list:
        return [await ferry.sync.send_update_async(senders, generate(step), step=step)
                for step in (1, 2)]

    senders = [ferry.Sender(a, bucket_bytes=BUCKET_BYTES, timeout=30) for a in addresses]
    try:
        threads = [_receive_updates(a, 2, out) for a, out in zip(addresses, got)]
        for s in senders:
            s.accept(1)
        results = asyncio.run(main(senders))
        for t in threads:
            t.join(30)
    finally:
        for s in senders:
            s.close()
    assert [[st.streamed for st in r] for r in results] == [[False, False], [True, True]]
    for out in got:
        for step, (sums, _, sent_step) in zip((1, 2), out):
            assert sums == _digests(make_weights(step))
            assert sent_step == step
    with pytest.raises(ferry.InvalidArgumentError, match="given twice"):
        ferry.sync.send_update([senders[0], senders[0]], [])

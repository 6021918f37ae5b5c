"""ferry.sync's send_update: one call per update that streams against the last update's
manifest and stages (learning it anew) when it changed, bit-exact either way, from a
generator refilling one buffer; with several Senders fed by one iterator; from a coroutine."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

import fake_device
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
    thread.join(30)  # the sender closed: the receiver's wait ends at once
    assert not thread.is_alive()
    assert len(got) == 1 and isinstance(got[0], ferry.FerryError), got  # no update arrived


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


async def _async_items(items, fail_at: int | None = None, stall_at: int | None = None,
                       stalled: asyncio.Event | None = None):
    """items as an async generator on the loop; raises KeyError at item `fail_at`, or stalls
    for good at `stall_at` after setting `stalled`."""
    for i, item in enumerate(items):
        await asyncio.sleep(0)
        if i == fail_at:
            raise KeyError(f"the generator failed at {item[0]}")
        if i == stall_at:
            stalled.set()
            await asyncio.sleep(3600)
        yield item


def _next_session_works(sender: ferry.Sender, address: str) -> None:
    """The session broke: a receiver joining anew gets the next update whole (staged: the
    failed update taught no manifest)."""
    assert sender.update_manifest is None
    got: list = []
    thread = _receive_updates(address, 1, got)
    sender.accept(1)
    weights = make_weights(3)
    stats = asyncio.run(sender.send_update_async(from_one_buffer(weights), step=3))
    thread.join(30)
    assert not stats.streamed and stats.tensors == len(weights)
    assert got[0][0] == _digests(weights) and got[0][2] == 3


@pytest.mark.parametrize("case", ["staged, nothing sent yet", "staged", "streamed"])
def test_an_async_generator_raising_mid_update_aborts_it_and_is_raised_unchanged(case):
    address, got = unique_address(), []
    weights = make_weights(2)
    # 1 MiB of staging: rounds went out before the generator fails; 64 MiB: none did.
    staging_bytes = (64 << 20) if case == "staged, nothing sent yet" else (1 << 20)
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 2 if case == "streamed" else 1, got)
        sender.accept(1)
        if case == "streamed":  # teaches the manifest: the failing update streams
            sender.send_update(make_weights(1))
        with pytest.raises(KeyError, match="the generator failed at small.92.fp32"):
            asyncio.run(sender.send_update_async(
                _async_items(from_one_buffer(weights), fail_at=100),
                staging_bytes=staging_bytes))
        if case == "staged, nothing sent yet":  # the session is intact: the same receiver
            stats = asyncio.run(sender.send_update_async(from_one_buffer(weights), step=3))
            thread.join(30)
            assert not stats.streamed
            assert got == [(_digests(weights), 1, 3)]
            return
        thread.join(30)
        assert isinstance(got[-1], ferry.AbortedError), got
        assert "KeyError" in str(got[-1]) and "small.92.fp32" in str(got[-1]), got
        _next_session_works(sender, address)


def test_a_cancelled_send_update_async_aborts_the_update_and_the_next_session_works():
    address, got = unique_address(), []
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 2, got)
        sender.accept(1)
        sender.send_update(make_weights(1))

        async def main() -> None:
            stalled = asyncio.Event()
            task = asyncio.create_task(sender.send_update_async(
                _async_items(make_weights(2), stall_at=50, stalled=stalled)))
            await asyncio.wait_for(stalled.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        thread.join(30)
        assert isinstance(got[-1], ferry.FerryError), got
        assert "the send was stopped: CancelledError" in str(got[-1]), got
        _next_session_works(sender, address)


def test_a_receiver_callback_raising_fails_send_update_async_naming_it():
    address, pulled, raised = unique_address(), [], []

    def receive() -> None:
        def on_tensor(name, tensor) -> None:
            if name == "norm.fp16":
                raise KeyError("the rollout's loader failed")

        with ferry.Receiver(address, 0, timeout=30) as receiver:
            try:
                while True:
                    receiver.receive_round(on_tensor)
            except KeyError as e:  # raised again unchanged by the receiver
                raised.append(e)

    async def generate():
        for item in make_weights(1):
            pulled.append(item[0])
            await asyncio.sleep(0)
            yield item

    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        sender.accept(1)
        # 1 MiB of staging: the first round (4 tensors) goes out while the generator runs.
        with pytest.raises(ferry.FerryError, match="the rollout's loader failed"):
            asyncio.run(sender.send_update_async(generate(), staging_bytes=1 << 20))
        thread.join(30)
    assert len(raised) == 1, raised
    assert len(pulled) < len(make_weights(1)), "the loop stopped pulling once the update failed"


@pytest.mark.parametrize("streamed", [False, True])
def test_send_update_async_keeps_one_pulled_tensor_alive_at_a_time(streamed):
    """Each tensor is a fresh one: when the generator makes the next, the ones before it
    must be gone (tensors are freed by reference counting) but for the last (which the
    pulling loop still names)."""
    import weakref

    address, got = unique_address(), []
    weights = make_weights(1)
    most_alive = []

    async def fresh():
        alive: list = []
        for name, tensor in weights:
            alive = [r for r in alive if r() is not None]
            most_alive.append(len(alive))
            copy = tensor.clone()
            alive.append(weakref.ref(copy))
            yield name, copy
            del copy

    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 1 + streamed, got)
        sender.accept(1)
        if streamed:
            sender.send_update(weights)
        stats = asyncio.run(sender.send_update_async(fresh(), staging_bytes=1 << 20))
        thread.join(30)
    assert stats.streamed == streamed
    assert got[-1][0] == _digests(weights)
    assert max(most_alive) <= 1, most_alive


def test_an_update_takes_one_call_at_a_time_holds_its_sender_and_a_closed_sender_aborts_it():
    """The UpdateWriter send_update_async drives: a put in flight (start_put, until wait()
    saw it done) refuses every other call; while the update is open its Sender refuses
    other rounds; closing the Sender mid-update aborts the update, which then says so."""
    address, got = unique_address(), []
    weights = make_weights(1)
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 1, got)
        sender.accept(1)
        writer = ferry._ferry.UpdateWriter.update([sender._impl])
        first, owner = ferry._tensors.tensor_arg(*weights[0])
        writer.start_put(first)
        with pytest.raises(ferry.FailedPreconditionError, match="one call at a time"):
            writer.finish()
        assert writer.wait(None)
        del owner
        with pytest.raises(ferry.FailedPreconditionError, match="UpdateWriter"):
            sender.send_round(weights)
        sender.close()
        second, owner = ferry._tensors.tensor_arg(*weights[1])
        with pytest.raises(ferry.FailedPreconditionError, match="closed before it ended"):
            writer.put(second)
    thread.join(30)
    assert len(got) == 1 and isinstance(got[0], ferry.FerryError), got  # nothing delivered


class _FailingDevice(fake_device.FakeDevice):
    """A fake device whose `what` ("copy_async" or "synchronize") raises at call `at`."""

    def __init__(self, what: str, at: int) -> None:
        super().__init__("fake:0", delay_s=0.0005)
        self.what, self.at, self.calls = what, at, 0

    def _count(self, what: str) -> None:
        if what == self.what:
            self.calls += 1
            if self.calls == self.at:
                raise RuntimeError(f"{what} failed (call {self.at})")

    def copy_async(self, dst, src) -> None:
        self._count("copy_async")
        super().copy_async(dst, src)

    def synchronize(self) -> None:
        self._count("synchronize")
        super().synchronize()


def test_a_device_copies_each_tensor_into_the_staging_buffer_then_the_ring_bit_exact():
    # Copies land 0.5 ms after they were started: bytes read before the update's flush
    # waited for them would be old ones. 256 KiB of staging: several staged rounds, and
    # big.int8 (700 KB) is larger than the buffer.
    device = fake_device.FakeDevice("fake:0", delay_s=0.0005)
    address, got = unique_address(), []
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 3, got)
        sender.accept(1)
        for step in (1, 2, 3):
            weights = make_weights(step)
            if step == 3:
                stats = asyncio.run(sender.send_update_async(
                    _async_items(weights), step=step, staging_bytes=256 << 10, device=device))
            else:
                stats = sender.send_update(weights, step=step, staging_bytes=256 << 10,
                                           device=device)
            assert stats.streamed == (step > 1) and stats.tensors == len(weights)
        thread.join(30)
    assert [g[0] for g in got] == [_digests(make_weights(s)) for s in (1, 2, 3)]
    assert got[0][1] > 1  # staged in several rounds
    assert sum(1 for entry in device.log if entry[0] == "issue") >= 3 * len(weights)


@pytest.mark.parametrize("what, at, streamed", [
    ("copy_async", 40, False), ("copy_async", 40, True), ("synchronize", 3, True)])
def test_a_device_raising_aborts_the_update_and_its_exception_is_raised_unchanged(what, at,
                                                                                  streamed):
    address, got = unique_address(), []
    device = _FailingDevice(what, at)
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _receive_updates(address, 2 if streamed else 1, got)
        sender.accept(1)
        if streamed:  # teaches the manifest: the failing update streams
            sender.send_update(make_weights(1))
        with pytest.raises(RuntimeError, match=f"{what} failed") as raised:
            asyncio.run(sender.send_update_async(_async_items(make_weights(2)),
                                                 staging_bytes=1 << 10, device=device))
        assert type(raised.value) is RuntimeError  # the device's own, not a FerryError
        thread.join(30)
        assert isinstance(got[-1], ferry.AbortedError), got
        assert f"raised RuntimeError: {what} failed" in str(got[-1]), got
        device.drain()
        _next_session_works(sender, address)

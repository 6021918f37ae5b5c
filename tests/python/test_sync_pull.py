"""ferry.sync's pull form: Receiver.receive_update(_async) yields one update's tensors as the
caller asks for them (no callback, no thread of ferry's), bit-exact over several rounds, with
the lifetime verl's engines rely on; a caller that leaves early or is cancelled fails the
sender's update with its reason."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

import ferry
from conftest import digest, unique_address
from weights import BUCKET_BYTES, make_weights


def _send_in_thread(sender: ferry.Sender, updates: list, out: list) -> threading.Thread:
    """Accepts one receiver, then sends each (weights, step) with send_update (1 MiB of
    staging: the first update takes several rounds); appends each UpdateStats, or the
    exception that ended the sending."""
    def run() -> None:
        try:
            sender.accept(1)
            for weights, step in updates:
                out.append(sender.send_update(weights, step=step, staging_bytes=1 << 20))
        except ferry.FerryError as e:
            out.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _digests(weights) -> dict:
    return {name: digest(t) for name, t in weights}


@pytest.mark.parametrize("writable", [False, True])
def test_updates_of_several_rounds_arrive_bit_exact_sync_and_async(writable):
    address, sent = unique_address(), []
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _send_in_thread(sender, [(make_weights(s), s) for s in (1, 2, 3)], sent)
        with ferry.Receiver(address, 0, timeout=30) as receiver:
            got = [_digests(receiver.receive_update(writable=writable))]
            assert receiver.round_stats.step == 1

            async def pull() -> dict:
                return {n: digest(t)
                        async for n, t in receiver.receive_update_async(writable=writable)}
            got += [asyncio.run(pull()), asyncio.run(pull())]
            assert receiver.round_stats.step == 3
        thread.join(30)
    assert [type(s).__name__ for s in sent] == ["UpdateStats"] * 3, sent
    assert sent[0].rounds > 1, "1 MiB of staging: the first update took several rounds"
    for step, sums in zip((1, 2, 3), got):
        assert sums == _digests(make_weights(step)), step


def _paired_weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """Twelve tensors of 128 KiB: two fill each 256 KiB bucket, six buckets."""
    g = torch.Generator().manual_seed(step)
    return [(f"w.{i}", torch.randn(32 * 1024, generator=g)) for i in range(12)]


@pytest.mark.parametrize("writable", [False, True])
def test_a_bucket_stays_intact_until_the_caller_moved_past_the_next_buckets_first(writable):
    """Tensors 2k and 2k+1 share bucket k. While the caller is on tensor 2k+2 (the next
    bucket's first), the sender, given time, must not have refilled bucket k's slot; a pull
    that released it early lets the 2-slot ring take bucket k+2 there."""
    address, sent = unique_address(), []
    weights = _paired_weights(7)
    expected = _digests(weights)
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, slots=2, timeout=30) as sender:
        thread = _send_in_thread(sender, [(weights, 1), (weights, 2)], sent)
        with ferry.Receiver(address, 0, timeout=30) as receiver:
            for _ in receiver.receive_update():  # staged; the second update is streamed
                pass

            async def pull() -> None:
                seen = []
                async for name, tensor in receiver.receive_update_async(writable=writable):
                    seen.append((name, tensor))
                    if len(seen) % 2 == 1 and len(seen) > 1:  # the first of bucket k+1
                        await asyncio.sleep(0.05)  # the sender's chance to refill too early
                        for held_name, held in seen[-3:-1]:
                            assert digest(held) == expected[held_name], held_name
                assert len(seen) == len(weights)
            asyncio.run(pull())
        thread.join(30)
    assert [type(s).__name__ for s in sent] == ["UpdateStats"] * 2, sent


def test_a_ring_of_one_slot_is_pulled_bucket_by_bucket():
    address, sent = unique_address(), []
    weights = make_weights(4)
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, slots=1, timeout=30) as sender:
        thread = _send_in_thread(sender, [(weights, 1)], sent)
        with ferry.Receiver(address, 0, timeout=30) as receiver:
            assert receiver.writable_views_error is not None

            async def pull() -> dict:
                return {n: digest(t) async for n, t in receiver.receive_update_async()}
            assert asyncio.run(pull()) == _digests(weights)
        thread.join(30)
    assert type(sent[0]).__name__ == "UpdateStats", sent


def _sender_error(sent: list) -> str:
    assert len(sent) == 1 and isinstance(sent[0], ferry.AbortedError), sent
    return str(sent[0])


def test_a_caller_that_leaves_early_fails_the_senders_update_naming_why():
    address, sent = unique_address(), []
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _send_in_thread(sender, [(make_weights(1), 1)], sent)
        receiver = ferry.Receiver(address, 0, timeout=30)

        async def pull() -> None:
            updates = receiver.receive_update_async()
            async for _ in updates:
                break
            await updates.aclose()
        asyncio.run(pull())
        thread.join(30)
        assert "closed receive_update_async before the update ended" in _sender_error(sent)
        with pytest.raises(ferry.FerryError, match="closed receive_update_async"):
            receiver.receive_update().__next__()  # the session is broken: connect anew
        receiver.close()


def test_a_sync_caller_that_raises_fails_the_senders_update():
    address, sent = unique_address(), []
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _send_in_thread(sender, [(make_weights(1), 1)], sent)
        with ferry.Receiver(address, 0, timeout=30) as receiver:
            with pytest.raises(ValueError):
                for name, _ in receiver.receive_update():
                    if name == "next.bf16":
                        raise ValueError("the loader does not know next.bf16")
        thread.join(30)
    assert "left receive_update before the update ended" in _sender_error(sent)


def test_a_task_cancelled_while_waiting_for_a_segment_fails_the_update_at_once():
    """The sender stalls mid-update; the receiving task is cancelled while it waits for the
    next segment. The sender hears why within moments, not at its timeout."""
    address, sent = unique_address(), []
    resume = threading.Event()
    weights = make_weights(2)

    def stalling():
        for i, item in enumerate(weights):
            if i == len(weights) // 2:
                resume.wait(30)
            yield item

    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        thread = _send_in_thread(sender, [(stalling(), 1)], sent)
        with ferry.Receiver(address, 0, timeout=30) as receiver:

            async def pull() -> int:
                count = 0
                async for _ in receiver.receive_update_async():
                    count += 1
                return count

            async def cancel_while_waiting() -> None:
                task = asyncio.ensure_future(pull())
                await asyncio.sleep(1.0)  # the sender is stalled by now
                started = time.monotonic()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert time.monotonic() - started < 5.0
            asyncio.run(cancel_while_waiting())
            resume.set()
        thread.join(30)
    assert "task receiving the update was cancelled" in _sender_error(sent)


def test_abort_from_another_thread_ends_a_waiting_receive():
    address, sent = unique_address(), []
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=30) as sender:
        accepted = threading.Thread(target=sender.accept, args=(1,), daemon=True)
        accepted.start()
        with ferry.Receiver(address, 0, timeout=30, idle_timeout=60) as receiver:
            accepted.join(30)
            threading.Timer(0.5, receiver.abort, args=("the rollout is shutting down",)).start()
            started = time.monotonic()
            with pytest.raises(ferry.AbortedError, match="the rollout is shutting down"):
                for _ in receiver.receive_update():  # no update comes: waits for a BEGIN
                    pass
            assert time.monotonic() - started < 5.0
        with pytest.raises(ferry.FerryError):
            sender.send_update(make_weights(1))


def test_an_abort_while_a_read_ahead_is_in_flight_ends_the_round_at_once():
    """The caller takes two tensors (the next segment is being read ahead meanwhile), then
    aborts from its own thread and stops iterating without closing anything, as verl's
    engine does when the task that asked ends. Whether the read in flight was waiting, busy
    (it breaks the session as it returns) or already done (the abort breaks it at once), the
    sender hears why within moments, not at its timeout."""
    address, sent = unique_address(), []
    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=20) as sender:
        thread = _send_in_thread(sender, [(make_weights(3), 3)], sent)
        with ferry.Receiver(address, 0, timeout=20) as receiver:

            async def take_two_then_abort() -> tuple:
                updates = receiver.receive_update_async()
                taken = 0
                async for _ in updates:
                    taken += 1
                    if taken == 2:
                        break
                aborted_at = time.monotonic()
                receiver.abort("the loader raised KeyError: 'lm_head'")
                thread.join(10)
                return updates, time.monotonic() - aborted_at
            updates, waited = asyncio.run(take_two_then_abort())
            del updates
    assert waited < 5.0, waited
    assert "the loader raised KeyError: 'lm_head'" in _sender_error(sent)

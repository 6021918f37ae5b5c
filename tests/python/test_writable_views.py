"""ferry.Receiver.receive_round_buckets_writable (and its per-segment form): a callback
writes into the tensors it is handed, in place, and neither the ring, another receiver nor
the next round sees it."""

from __future__ import annotations

import mmap
import threading

import pytest
import torch

import ferry
from conftest import unique_address

ROUNDS = 3
BUCKET = 16 * mmap.PAGESIZE


def _weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """Tensors of a few pages (several to a bucket) and one spanning several buckets."""
    g = torch.Generator().manual_seed(step)
    out = [(f"layer.{i}", torch.randn(3000 + 100 * i, generator=g)) for i in range(8)]
    out.append(("embed", torch.randn(BUCKET // 2, generator=g).to(torch.bfloat16)))
    return out


def test_writes_in_place_stay_private_and_each_round_shows_its_own_bytes():
    address = unique_address()
    sender = ferry.Sender(address, bucket_bytes=BUCKET, slots=2, timeout=30)
    buckets_written = threading.Semaphore(0)
    errors: list[str] = []

    def writer() -> None:
        with ferry.Receiver(address, 0, timeout=30) as receiver:
            assert receiver.writable_views_error is None
            for step in range(1, ROUNDS + 1):
                expected = dict(_weights(step))

                def on_bucket(weights, is_last, round_ends):
                    for name, tensor in weights:
                        if not torch.equal(tensor, expected[name]):
                            errors.append(f"writer, round {step}: stale bytes in {name}")
                        tensor.fill_(-7)  # in place: the ring is read-only, this view is not
                        if not torch.all(tensor == -7):
                            errors.append(f"writer, round {step}: the write into {name} is lost")
                    buckets_written.release()

                receiver.receive_round_buckets_writable(on_bucket)

    def reader() -> None:
        with ferry.Receiver(address, 1, timeout=30) as receiver:
            for step in range(1, ROUNDS + 1):
                expected = dict(_weights(step))

                def on_bucket(weights, is_last):
                    # The writer holds this bucket too: copy it only after it wrote there.
                    if not buckets_written.acquire(timeout=20):
                        errors.append("the writer did not write its bucket")
                    for name, tensor in weights:
                        if not torch.equal(tensor, expected[name]):
                            errors.append(f"reader, round {step}: the writer's write reached "
                                          f"{name}")

                receiver.receive_round_buckets(on_bucket)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    try:
        sender.accept(2)
        for step in range(1, ROUNDS + 1):
            sender.send_round(_weights(step))
    finally:
        for t in threads:
            t.join(60)
        sender.close()
    assert not errors, errors[:5]


def test_a_ring_of_one_slot_says_why_it_gives_no_writable_views():
    address = unique_address()
    sender = ferry.Sender(address, bucket_bytes=BUCKET, slots=1, timeout=30)
    accepted = threading.Thread(target=sender.accept, args=(1,))
    accepted.start()
    try:
        with ferry.Receiver(address, 0, timeout=30) as receiver:
            # Joined before it leaves: a receiver gone before the sender's accept() counted
            # it is waited for to join again (the whole timeout, on a loaded machine).
            accepted.join(30)
            assert "2 slots" in receiver.writable_views_error
            with pytest.raises(ferry.FailedPreconditionError, match="2 slots"):
                receiver.receive_round_buckets_writable(lambda *_: None)
    finally:
        accepted.join(30)
        sender.close()


def test_segment_delivery_hands_out_a_tensor_before_its_bucket_is_filled():
    """receive_round_segments_writable: the first segment's tensors reach the callback while
    the sender still waits to pack the rest of the bucket (its producer blocks until they
    did), bit-exact and writable; one call ends the bucket, and with it the round."""
    mib = 1 << 20
    address = unique_address()
    sender = ferry.Sender(address, bucket_bytes=48 * mib, slots=2, timeout=30)
    g = torch.Generator().manual_seed(5)
    weights = [(f"layer.{i}", torch.randn(mib, generator=g)) for i in range(8)]  # 4 MiB each
    expected = dict(weights)
    seen_first = threading.Event()
    calls: list[tuple[list[str], bool, bool, bool]] = []
    errors: list[str] = []

    def produce():
        for i, (name, tensor) in enumerate(weights):
            if i == 4 and not seen_first.wait(20):  # the first 16 MiB segment is published
                errors.append("no tensor reached the receiver before the bucket was filled")
            yield name, tensor

    def receive() -> None:
        with ferry.Receiver(address, 0, timeout=30) as receiver:
            def on_segment(tensors, bucket_ends, is_last, round_ends):
                calls.append(([n for n, _ in tensors], bucket_ends, is_last, round_ends))
                for name, tensor in tensors:
                    if not torch.equal(tensor, expected[name]):
                        errors.append(f"wrong bytes in {name}")
                    tensor.fill_(-7)
                seen_first.set()

            receiver.receive_round_segments_writable(on_segment)

    thread = threading.Thread(target=receive)
    thread.start()
    try:
        sender.accept(1)
        sender.send_round_streamed([(n, t.dtype, t.shape) for n, t in weights], produce())
    finally:
        thread.join(60)
        sender.close()
    assert not errors, errors
    assert [n for names, *_ in calls for n in names] == [n for n, _ in weights]
    assert calls[0][0] and calls[0][1:] == (False, False, False), calls
    assert [c[1:] for c in calls if c[1]] == [(True, True, True)], calls

"""ferry.Receiver.receive_round_buckets_writable: a callback writes into the tensors it is
handed, in place, and neither the ring, another receiver nor the next round sees it."""

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
            assert "2 slots" in receiver.writable_views_error
            with pytest.raises(ferry.FailedPreconditionError, match="2 slots"):
                receiver.receive_round_buckets_writable(lambda *_: None)
    finally:
        accepted.join(30)
        sender.close()

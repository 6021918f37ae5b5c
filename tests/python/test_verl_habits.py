"""verl's habits that ferry.verl must survive (issue #17 item 4, issue #15 item 6): generators
that reuse one buffer, callbacks that write their tensors, names yielded twice, keyword
typos, buckets with no whole tensor, and a device this process cannot use."""

from __future__ import annotations

import asyncio
import warnings

import pytest
import torch

import ferry
from conftest import run_ok_peers, unique_zmq_handle

BUCKET_MB = 1
REUSED_TENSORS = 96
REUSED_ELEMENTS = 4096  # 16 KiB of f32 each: all 96 in one round and a few buckets


def _reused_buffer_sender(handle: str, queue) -> None:
    from ferry import verl

    def generator():
        # verl's nixl engine with device=cpu: one staging buffer, refilled for every yield.
        buffer = torch.empty(REUSED_ELEMENTS, dtype=torch.float32)
        for i in range(REUSED_TENSORS):
            buffer.fill_(float(i))
            yield f"layer.{i}.weight", buffer.view(64, 64)

    try:
        asyncio.run(verl.BucketedWeightSender(handle, bucket_size_mb=BUCKET_MB)
                    .async_send_weights(generator()))
        queue.put(("ok",))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def _value_receiver(handle: str, queue, write: bool = False) -> None:
    """Puts ("ok", [(name, set of values)] in arrival order, bucket sizes)."""
    from ferry import verl

    try:
        got, sizes = [], []

        def on_bucket_received(weights, is_last):
            sizes.append(len(weights))
            for name, t in weights:
                got.append((name, sorted(set(t.flatten().tolist()))))
                if write:  # verl's callbacks may write their tensors (e.g. in-place casts)
                    t.mul_(2).add_(1)

        verl.BucketedWeightReceiver(handle, "cpu").receive_weights(on_bucket_received)
        queue.put(("ok", got, sizes))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def _writing_receiver(handle: str, queue) -> None:
    _value_receiver(handle, queue, write=True)


def test_generator_reusing_one_buffer_delivers_every_tensor():
    sent, received = run_ok_peers(_reused_buffer_sender, _value_receiver)
    got = received[1]
    assert len(got) == REUSED_TENSORS
    wrong = [name for i, (name, values) in enumerate(got)
             if name != f"layer.{i}.weight" or values != [float(i)]]
    assert not wrong, f"{len(wrong)} of {REUSED_TENSORS} tensors carry another's data: {wrong[:4]}"


def test_callback_writing_a_cpu_tensor_in_place_does_not_crash():
    # run_ok_peers fails the test if the receiver dies (SIGSEGV before the fix).
    sent, received = run_ok_peers(_reused_buffer_sender, _writing_receiver)
    # Each tensor was read before the callback wrote it: writes do not leak into later ones.
    assert [values for _, values in received[1]] == [[float(i)] for i in range(REUSED_TENSORS)]


def _send_list(handle: str, queue, weights) -> None:
    from ferry import verl

    try:
        asyncio.run(verl.BucketedWeightSender(handle, bucket_size_mb=BUCKET_MB)
                    .async_send_weights(iter(weights)))
        queue.put(("ok",))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def _duplicate_sender(handle: str, queue) -> None:
    _send_list(handle, queue,
               [("a", torch.zeros(8)), ("b", torch.full((8,), 5.0)), ("a", torch.ones(8))])


def test_duplicate_names_in_one_update_keep_the_last_as_verl():
    sent, received = run_ok_peers(_duplicate_sender, _value_receiver)
    # Both arrive in yield order, so a loader applying them in turn keeps the last.
    assert received[1] == [("a", [0.0]), ("b", [5.0]), ("a", [1.0])]


def test_buckets_without_a_whole_tensor_are_not_handed_to_the_callback():
    # The 3 MiB tensor spans three 1 MiB buckets: the first two complete nothing.
    sent, received = run_ok_peers(_big_tensor_sender, _value_receiver)
    _, got, sizes = received
    assert [name for name, _ in got] == ["big", "small"]
    assert sizes and all(n > 0 for n in sizes), sizes


def _big_tensor_sender(handle: str, queue) -> None:
    _send_list(handle, queue, [("big", torch.full((3 << 18,), 2.0)), ("small", torch.full((4,), 3.0))])


def test_unknown_constructor_keywords_warn_once_by_name():
    from ferry import verl

    handle = unique_zmq_handle()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            verl.BucketedWeightSender(handle, bucket_size_mb=64, bucket_size_m=64, attempt_id=1)
            verl.BucketedWeightReceiver(handle, "cpu", use_sh=True, target_version=2)
    messages = [str(w.message) for w in caught]
    assert messages == [
        "BucketedWeightSender: unknown keyword argument 'bucket_size_m' is ignored",
        "BucketedWeightReceiver: unknown keyword argument 'use_sh' is ignored",
    ], messages


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_fails_at_construction():
    from ferry import verl

    with pytest.raises(ferry.InvalidArgumentError, match="device 'cuda:0' is not usable"):
        verl.BucketedWeightReceiver(unique_zmq_handle(), "cuda:0")

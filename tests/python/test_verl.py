"""ferry.verl between spawned processes, used the way verl uses its own classes: a new
sender and receiver object per update, generators and async iterators, a callback that
raises."""

from __future__ import annotations

import asyncio
import secrets

import pytest
import torch

from conftest import digest, new_process, processes, run_ok_peers, run_peers, unique_zmq_handle
from weights import make_weights

ROUNDS = 3
BUCKET_MB = 1


def _big_weights(r: int) -> list[tuple[str, torch.Tensor]]:
    # 3 MiB of bf16: three times verl's bucket, the FAQ's "too large to fit" case.
    g = torch.Generator().manual_seed(r)
    return [("model.embed_tokens.weight", torch.randn(1024, 1536, generator=g).to(torch.bfloat16))
            ] + make_weights(r)


def _weights_source(r: int):
    weights = _big_weights(r)
    if r == 1:
        async def agen():
            for item in weights:
                await asyncio.sleep(0)
                yield item
        return agen()
    return (item for item in weights)


def _sender(handle: str, queue) -> None:
    from ferry import verl

    try:
        sums, sessions = [], []
        for r in range(ROUNDS):
            # Update 2 streams as several rounds (mixed dtypes, strides, an async iterator).
            sender = verl.BucketedWeightSender(handle, bucket_size_mb=BUCKET_MB, use_shm=True,
                                               round_bytes=(2 << 20) if r == 1 else None)
            asyncio.run(sender.async_send_weights(_weights_source(r)))
            sums.append({name: digest(t) for name, t in _big_weights(r)})
            sessions.append(verl._senders[verl.ferry_address(handle)][0].session_id)
        queue.put(("ok", sums, sessions))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def _receiver(handle: str, queue) -> None:
    from ferry import verl

    try:
        rounds, sessions = [], []
        for _ in range(ROUNDS):
            receiver = verl.BucketedWeightReceiver(handle, torch.device("cpu"), use_shm=True)
            sums, order, flags, devices = {}, [], [], set()

            def on_bucket_received(weights, is_last):
                flags.append(is_last)
                for name, t in weights:
                    order.append(name)
                    devices.add(str(t.device))
                    sums[name] = digest(t)

            receiver.receive_weights(on_bucket_received)
            rounds.append((sums, order, flags, sorted(devices)))
            sessions.append(verl._receivers[receiver.address].session_id)
        queue.put(("ok", rounds, sessions))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def _free_port() -> int:
    # Below the ephemeral range, so no connect() of a test running beside takes it first.
    from ferry.verl.checkpoint_engine import _free_port as free_port

    return free_port("127.0.0.1")


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_verl_updates_reuse_one_session(transport, monkeypatch):
    if transport == "tcp":  # the net transport (UCX), authenticated with the token
        monkeypatch.setenv("FERRY_TOKEN", secrets.token_hex(32))  # `ferry token new`'s kind
        handle = f"tcp://127.0.0.1:{_free_port()}"
    else:
        handle = unique_zmq_handle()
    sent, received = run_ok_peers(_sender, _receiver, handle)
    _, sent_sums, sender_sessions = sent
    _, rounds, receiver_sessions = received
    # One session for every update: ring and sockets persist across rounds.
    assert len(set(sender_sessions)) == 1 and sender_sessions == receiver_sessions
    names = [name for name, _ in _big_weights(0)]
    for r, (sums, order, flags, devices) in enumerate(rounds):
        assert order == names, "verl's order of tensors"
        # Several buckets (the ones that only carry pieces of the 3 MiB tensor are not handed over).
        assert flags[-1] is True and not any(flags[:-1]) and len(flags) > 1
        assert devices == ["cpu"]
        bad = [n for n in names if sums[n] != sent_sums[r][n]]
        assert not bad, f"update {r + 1}: wrong bytes for {bad}"


def _raising_receiver(handle: str, queue) -> None:
    from ferry import verl

    receiver = verl.BucketedWeightReceiver(handle, "cpu")
    calls = []

    def on_bucket_received(weights, is_last):
        calls.append(len(weights))
        if len(calls) == 2:
            raise KeyError("decoder.layers.0.self_attention.q_layernorm.weight")

    try:
        receiver.receive_weights(on_bucket_received)
        first = ("no error", None)
    except KeyError as e:
        first = ("KeyError", str(e))
    except Exception as e:
        first = (type(e).__name__, str(e))
    # The next update works on a new session.
    got = {}
    try:
        verl.BucketedWeightReceiver(handle, "cpu").receive_weights(
            lambda weights, is_last: got.update({n: digest(t) for n, t in weights}))
        second = ("ok", got)
    except Exception as e:
        second = (type(e).__name__, str(e))
    queue.put((first, calls, second))


def _sender_after_error(handle: str, queue) -> None:
    import ferry
    from ferry import verl

    weights = _big_weights(7)
    try:
        asyncio.run(verl.BucketedWeightSender(handle, bucket_size_mb=BUCKET_MB)
                    .async_send_weights(iter(weights)))
        first = ("no error", None)
    except ferry.FerryError as e:
        first = (type(e).__name__, str(e))
    try:
        asyncio.run(verl.BucketedWeightSender(handle, bucket_size_mb=BUCKET_MB)
                    .async_send_weights(iter(weights)))
        second = ("ok", {n: digest(t) for n, t in weights})
    except Exception as e:
        second = (type(e).__name__, str(e))
    queue.put((first, second))


def test_receiver_callback_raising_reaches_the_sender():
    handle = unique_zmq_handle()
    sent, received = run_peers((_sender_after_error, handle), (_raising_receiver, handle))
    (kind, message), sent_second = sent
    assert kind == "AbortedError", sent
    assert "KeyError" in message and "q_layernorm" in message, message
    (rx_kind, rx_message), calls, rx_second = received
    assert rx_kind == "KeyError" and "q_layernorm" in rx_message
    assert len(calls) == 2
    # Both sides start a new session for the next update, which arrives whole.
    assert sent_second[0] == "ok", sent_second
    assert rx_second[0] == "ok", rx_second
    assert rx_second[1] == sent_second[1]


def _killed_receiver(handle: str, queue) -> None:
    import os
    import signal

    from ferry import verl

    queue.put("joined")
    verl.BucketedWeightReceiver(handle, "cpu").receive_weights(
        lambda weights, is_last: os.kill(os.getpid(), signal.SIGKILL))


def test_receiver_killed_mid_update_fails_the_sender_at_once():
    import time

    handle = unique_zmq_handle()
    q = processes().Queue()
    victim = new_process(_killed_receiver, handle, q)
    victim.start()
    try:
        assert q.get(timeout=120) == "joined"
        start = time.monotonic()
        (result,) = run_peers((_send_once, handle))
        assert result[0] in ("AbortedError", "IoError"), result
        assert time.monotonic() - start < 60, "the sender must not wait for its timeout"
        victim.join(30)
        assert victim.exitcode == -9
    finally:
        if victim.is_alive():
            victim.kill()


def _send_once(handle: str, queue) -> None:
    import ferry
    from ferry import verl

    try:
        asyncio.run(verl.BucketedWeightSender(handle, bucket_size_mb=BUCKET_MB)
                    .async_send_weights(iter(_big_weights(3))))
        queue.put(("no error", ""))
    except ferry.FerryError as e:
        queue.put((type(e).__name__, str(e)))


STREAM_TENSORS = 24
STREAM_TENSOR_BYTES = 1 << 20  # 1 MiB each: 24 MiB in all, against 2 MiB rounds


def _stream_tensor(i: int) -> torch.Tensor:
    return torch.full((STREAM_TENSOR_BYTES // 4,), float(i), dtype=torch.float32)


def _streaming_sender(handle: str, queue) -> None:
    import gc
    import weakref

    from ferry import verl

    alive_at_yield = []

    def generator():
        refs = []
        for i in range(STREAM_TENSORS):
            gc.collect()
            # Tensors yielded earlier that the sender still holds.
            alive_at_yield.append(sum(ref() is not None for ref in refs))
            t = _stream_tensor(i)
            refs.append(weakref.ref(t))
            yield f"layer.{i}", t
            del t

    try:
        sender = verl.BucketedWeightSender(handle, bucket_size_mb=1, round_bytes=2 << 20)
        asyncio.run(sender.async_send_weights(generator()))
        queue.put(("ok", alive_at_yield, verl._senders[sender.address][0].rounds_sent))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def _streaming_receiver(handle: str, queue) -> None:
    from ferry import verl

    try:
        got, flags = {}, []

        def on_bucket_received(weights, is_last):
            flags.append(is_last)
            for name, t in weights:
                got[name] = digest(t)

        verl.BucketedWeightReceiver(handle, "cpu").receive_weights(on_bucket_received)
        queue.put(("ok", got, flags))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def test_update_streams_without_holding_the_model():
    sent, received = run_ok_peers(_streaming_sender, _streaming_receiver)
    _, alive_at_yield, rounds = sent
    # 2 MiB rounds of 1 MiB tensors: the sender never holds more than a round's worth.
    assert max(alive_at_yield) <= 2, alive_at_yield
    assert rounds == STREAM_TENSORS // 2, "one update, streamed as several rounds"
    _, got, flags = received
    want = {f"layer.{i}": digest(_stream_tensor(i)) for i in range(STREAM_TENSORS)}
    assert got == want
    # The rounds are invisible to the callback: one update, is_last once, at its end.
    assert flags[-1] is True and not any(flags[:-1])

"""In-process checks of the Python layer: dtypes, conversions, errors, asyncio, addresses.

Sender and receiver run in two threads of one process here, which works only because
every transfer releases the GIL."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

import ferry
from ferry import verl
from conftest import digest, unique_address

TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]


def _sample(dtype: torch.dtype, n: int = 1000) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(n, generator=g, dtype=torch.float32).to(dtype)
    return torch.randint(-100 if dtype != torch.uint8 else 0, 100, (n,), generator=g,
                         dtype=dtype)


class Pair:
    """A sender and a receiver thread; receive(fn) runs fn(receiver) in the thread."""

    def __init__(self, bucket_bytes: int = 64 << 10, **receiver_kwargs) -> None:
        self.address = unique_address()
        self.sender = ferry.Sender(self.address, bucket_bytes=bucket_bytes, timeout=20)
        self.receiver = None
        connect = threading.Thread(target=self._connect, kwargs=receiver_kwargs)
        connect.start()
        self.sender.accept(1)
        connect.join()

    def _connect(self, **kwargs) -> None:
        self.receiver = ferry.Receiver(self.address, 0, timeout=20, **kwargs)

    def round(self, weights, receive) -> tuple:
        out = {}

        def run():
            try:
                out["value"] = receive(self.receiver)
            except BaseException as e:
                out["error"] = e

        t = threading.Thread(target=run)
        t.start()
        try:
            stats = self.sender.send_round(weights)
        finally:
            t.join(30)
        assert not t.is_alive()
        return stats, out

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()


def test_every_torch_dtype_round_trips():
    weights = [(str(d), _sample(d)) for d in TORCH_DTYPES]
    weights.append(("bf16.2d.strided", torch.randn(64, 96).to(torch.bfloat16)[::3, 1::2]))
    pair = Pair()
    got = {}
    stats, out = pair.round(weights, lambda r: r.receive_round(
        lambda name, t: got.update({name: (t.dtype, tuple(t.shape), digest(t))})))
    assert "error" not in out, out
    for name, t in weights:
        assert got[name] == (t.dtype, tuple(t.shape), digest(t)), name
    assert stats.tensors == len(weights)
    pair.close()


def test_numpy_in_and_out_and_raw_bytes():
    arrays = {"f32": np.arange(5000, dtype=np.float32).reshape(50, 100)[:, ::2],
              "u16": np.arange(3000, dtype=np.uint16), "c64": np.ones(10, np.complex64),
              "raw": bytearray(b"ferry" * 100)}
    pair = Pair(output="numpy")
    got = {}
    _, out = pair.round(arrays, lambda r: r.receive_round(
        lambda name, a: got.update({name: a.copy()})))
    assert "error" not in out, out
    np.testing.assert_array_equal(got["f32"], arrays["f32"])
    assert got["u16"].dtype == np.uint16 and (got["u16"] == arrays["u16"]).all()
    assert got["c64"].dtype == np.complex64
    assert bytes(got["raw"]) == bytes(arrays["raw"])
    pair.close()


def test_destinations_are_written_in_place():
    weights = {"a": torch.randn(10_000), "b": torch.randn(3, 7).to(torch.bfloat16)}
    pair = Pair(bucket_bytes=4096)
    dest = {n: torch.zeros_like(t) for n, t in weights.items()}
    pair.receiver.set_destinations(dest)
    _, out = pair.round(weights, lambda r: r.receive_round_into())
    assert "error" not in out, out
    for n in weights:
        assert torch.equal(dest[n], weights[n])
    with pytest.raises(ferry.InvalidArgumentError, match="contiguous"):
        pair.receiver.set_destination("c", torch.zeros(4, 4).t())
    pair.close()


def test_errors_are_typed_and_keep_the_message():
    with pytest.raises(ferry.InvalidArgumentError) as info:
        ferry.parse_dtype("float7")
    assert info.value.code == "invalid_argument" and "float7" in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ferry.FerryError)
    with pytest.raises(ferry.InvalidArgumentError, match="multiple of 16"):
        ferry.Sender(unique_address(), bucket_bytes=1000)
    with pytest.raises(ferry.InvalidArgumentError, match="no dtype for torch.complex128"):
        ferry.ferry_dtype(torch.complex128)
    with ferry.Sender(unique_address(), bucket_bytes=4096, timeout=0.2) as sender:
        with pytest.raises(ferry.FailedPreconditionError, match="no receiver"):
            sender.send_round({"a": torch.zeros(1)})
        with pytest.raises(ferry.TimeoutError, match="no receiver"):
            sender.accept(1)
        assert isinstance(ferry.TimeoutError("x"), TimeoutError)
    with pytest.raises(ferry.FerryError):
        ferry.Receiver(unique_address(), 0, timeout=0.2)


def test_duplicate_names_and_dead_receiver():
    pair = Pair()
    with pytest.raises(ferry.InvalidArgumentError, match="'a' appears twice"):
        pair.round([("a", torch.zeros(1)), ("a", torch.ones(1))], lambda r: None)
    pair.close()
    pair = Pair()
    pair.receiver.close()  # the peer goes away: the sender fails at once, no hang
    with pytest.raises(ferry.FerryError):
        pair.sender.send_round({"a": torch.zeros(100_000)})
    pair.sender.close()


def test_send_is_awaitable_and_leaves_the_loop_free():
    pair = Pair()
    weights = {"w": torch.randn(300_000)}
    ticks = []

    async def main():
        async def ticker():
            while True:
                ticks.append(1)
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        got = {}
        t = threading.Thread(target=lambda: pair.receiver.receive_round(
            lambda n, x: got.update({n: digest(x)})))
        t.start()
        stats = await pair.sender.send_round_async(weights)
        t.join()
        task.cancel()
        return stats, got

    stats, got = asyncio.run(main())
    assert got == {"w": digest(weights["w"])} and stats.bytes == 1_200_000
    assert ticks, "the event loop ran while the round was in flight"
    pair.close()


def test_zmq_handles_map_to_ferry_addresses():
    assert verl.ferry_address("ipc:///tmp/rl-colocate-zmq-1.sock") == \
        "@ferry/tmp/rl-colocate-zmq-1.sock"
    assert verl.ferry_address("@mine") == "@mine"
    long = "ipc:///tmp/" + "x" * 200 + ".sock"
    assert verl.ferry_address(long) == verl.ferry_address(long)
    assert len(verl.ferry_address(long)) <= 107
    assert verl.ferry_address("tcp://127.0.0.1:5555") == "127.0.0.1:5555"
    with pytest.raises(ferry.InvalidArgumentError, match="HOST:PORT"):
        verl.ferry_address("tcp://127.0.0.1")
    with pytest.raises(ferry.UnimplementedError, match="inproc://"):
        verl.ferry_address("inproc://x")
    with pytest.raises(ferry.InvalidArgumentError):
        verl.ferry_address("not-a-handle")


def test_presets_give_model_shapes():
    specs = ferry.hf_tensor_specs("qwen2.5-0.5b", ferry.DType.BF16)
    assert specs[0][0] == "model.embed_tokens.weight" and list(specs[0][2]) == [151936, 896]
    assert ferry.tensor_bytes(ferry.DType.BF16, [151936, 896]) == 151936 * 896 * 2


def _interrupt_soon(delay_s: float = 0.5) -> threading.Timer:
    import os
    import signal

    timer = threading.Timer(delay_s, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_ends_a_blocking_wait_at_once():
    import time

    # A sender waiting for receivers that never come (its timeout: 20 s).
    sender = ferry.Sender(unique_address(), bucket_bytes=64 << 10, timeout=20)
    start = time.monotonic()
    _interrupt_soon()
    with pytest.raises(KeyboardInterrupt):
        sender.accept(1)
    assert time.monotonic() - start < 5, "Ctrl-C waited for the accept timeout"
    sender.close()

    # A receiver waiting for a round that never begins (idle_timeout 20 s).
    pair = Pair(idle_timeout=20)
    start = time.monotonic()
    _interrupt_soon()
    with pytest.raises(KeyboardInterrupt):
        pair.receiver.receive_round_into()
    assert time.monotonic() - start < 5, "Ctrl-C waited for the idle timeout"
    # The interrupted receiver's session is over: the sender hears so, it does not hang.
    with pytest.raises(ferry.FerryError):
        pair.sender.send_round({"a": torch.zeros(100_000)})
    pair.close()


def test_sync_options_wire_protect_names_a_mode_and_refuses_others():
    assert ferry.SyncOptions().wire_protect == "none"
    opts = ferry.SyncOptions(wire_protect="encrypt")
    assert opts.wire_protect == "encrypt"
    opts.wire_protect = "none"
    assert "wire_protect='none'" in repr(opts)
    with pytest.raises(ferry.InvalidArgumentError, match="'hmac' is not one of none, mac, encrypt"):
        opts.wire_protect = "hmac"

"""ferry.Sender.send_round_streamed_async: a generator pulled on the event loop's thread (as
verl's must be) while the sender copies each tensor into the ring on its own thread. The
receiver runs in the same process and, where it matters, on the same loop: the sender must
not hold the loop while it waits for a slot that only the loop can free."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

import ferry
from conftest import digest, unique_address
from weights import BUCKET_BYTES, from_one_buffer as _from_one_buffer, make_weights, \
    specs_of as _specs

TIMEOUT_S = 60


async def _async_from_one_buffer(weights):
    for item in _from_one_buffer(weights):
        await asyncio.sleep(0)
        yield item


class _Session:
    """A sender and one receiver thread; received digests (or the receiver's error) per round.
    With on_loop, each bucket is released only once a coroutine on the sender's loop saw it."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.address = unique_address()
        self.sender = ferry.Sender(self.address, bucket_bytes=BUCKET_BYTES, timeout=TIMEOUT_S)
        self.rounds: list = []
        self._loop = loop
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()
        self.sender.accept(1)

    def _receive(self) -> None:
        receiver = ferry.Receiver(self.address, 0, timeout=TIMEOUT_S)
        while True:
            sums: dict = {}

            def on_bucket(views, is_last) -> None:
                for name, tensor in views:
                    sums[name] = digest(tensor)
                if self._loop is not None:  # the bucket is done once the loop ran this
                    seen = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop)
                    seen.result(TIMEOUT_S)

            try:
                receiver.receive_round_buckets(on_bucket)
                self.rounds.append(sums)
            except ferry.FerryError as e:
                self.rounds.append(e)
                return

    def close(self) -> None:
        self.sender.close()
        self._thread.join(TIMEOUT_S)


def _expected(weights) -> dict:
    return {name: digest(t) for name, t in weights}


@pytest.mark.parametrize("make_items", [_from_one_buffer, _async_from_one_buffer])
def test_generator_on_the_loop_refilling_one_buffer_is_bit_exact_round_after_round(make_items):
    async def main() -> None:
        session = _Session(asyncio.get_running_loop())
        try:
            for r in range(3):
                weights = make_weights(r)
                stats = await asyncio.wait_for(
                    session.sender.send_round_streamed_async(_specs(weights),
                                                             make_items(weights)), TIMEOUT_S)
                assert stats.tensors == len(weights)
                assert stats.buckets > 2  # more buckets than slots: the loop freed slots
        finally:
            session.close()
        assert session.rounds[:3] == [_expected(make_weights(r)) for r in range(3)]

    asyncio.run(main())


def test_an_exception_in_the_generator_is_raised_unchanged_and_aborts_the_round():
    def raising(weights):
        for i, item in enumerate(weights):
            if i == 100:
                raise ValueError(f"the generator failed at {item[0]}")
            yield item

    async def main() -> _Session:
        session = _Session()
        weights = make_weights(0)
        try:
            with pytest.raises(ValueError, match="the generator failed at small.92.fp32"):
                await session.sender.send_round_streamed_async(_specs(weights), raising(weights))
        finally:
            session.close()
        return session

    session = asyncio.run(main())
    assert isinstance(session.rounds[0], ferry.AbortedError), session.rounds
    assert "ValueError: the generator failed at small.92.fp32" in str(session.rounds[0])


@pytest.mark.parametrize("case, message", [
    ("renamed", "tensor 1 is 'other' F16[1000], but the manifest has 'norm.fp16' F16[1000]"),
    ("missing", "the tensors ended before tensor 308 'tail.int8' (the manifest has 309)"),
    ("extra", "tensor 309 'extra' is one more than the 309 of the manifest"),
])
def test_a_stream_differing_from_the_manifest_fails_naming_the_tensor(case, message):
    weights = make_weights(0)
    items = list(weights)
    if case == "renamed":
        items[1] = ("other", items[1][1])
    elif case == "missing":
        items.pop()
    else:
        items.append(("extra", torch.zeros(2)))

    async def main() -> _Session:
        session = _Session()
        try:
            with pytest.raises(ferry.InvalidArgumentError) as raised:
                await session.sender.send_round_streamed_async(_specs(weights), iter(items))
            assert message in str(raised.value)
        finally:
            session.close()
        return session

    session = asyncio.run(main())
    assert isinstance(session.rounds[0], ferry.FerryError), session.rounds


def test_a_cancelled_send_aborts_the_round_and_the_next_session_works():
    async def main() -> None:
        session = _Session()
        weights = make_weights(0)
        stalled = asyncio.Event()

        async def stalling():
            for i, item in enumerate(weights):
                if i == 50:
                    stalled.set()
                    await asyncio.sleep(3600)
                yield item

        task = asyncio.create_task(
            session.sender.send_round_streamed_async(_specs(weights), stalling()))
        await asyncio.wait_for(stalled.wait(), TIMEOUT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        session.sender.close()
        session._thread.join(TIMEOUT_S)
        assert isinstance(session.rounds[0], ferry.FerryError), session.rounds

    asyncio.run(main())


def test_an_async_generator_raising_is_raised_unchanged_and_the_next_session_works():
    async def raising(weights):
        for i, item in enumerate(weights):
            await asyncio.sleep(0)
            if i == 100:
                raise ValueError(f"the generator failed at {item[0]}")
            yield item

    async def main() -> _Session:
        session = _Session(asyncio.get_running_loop())
        weights = make_weights(0)
        try:
            with pytest.raises(ValueError, match="the generator failed at small.92.fp32"):
                await asyncio.wait_for(session.sender.send_round_streamed_async(
                    _specs(weights), raising(_from_one_buffer(weights))), TIMEOUT_S)
            await asyncio.get_running_loop().run_in_executor(None, session._thread.join,
                                                             TIMEOUT_S)
            # The session broke: a receiver joining anew gets the next round whole.
            session._thread = threading.Thread(target=session._receive, daemon=True)
            session._thread.start()
            await session.sender.accept_async(1)
            weights = make_weights(1)
            await asyncio.wait_for(session.sender.send_round_streamed_async(
                _specs(weights), _async_from_one_buffer(weights)), TIMEOUT_S)
        finally:
            session.close()
        return session

    session = asyncio.run(main())
    assert isinstance(session.rounds[0], ferry.AbortedError), session.rounds
    assert "ValueError: the generator failed at small.92.fp32" in str(session.rounds[0])
    assert session.rounds[1] == _expected(make_weights(1)), session.rounds


def test_a_receiver_callback_raising_fails_the_send_and_stops_the_pulls():
    address, pulled = unique_address(), []
    weights = make_weights(0)

    def receive() -> None:
        def on_bucket(views, is_last) -> None:
            raise KeyError("the rollout's loader failed")

        with ferry.Receiver(address, 0, timeout=TIMEOUT_S) as receiver:
            with pytest.raises(KeyError):
                receiver.receive_round_buckets(on_bucket)

    async def generate():
        for item in _from_one_buffer(weights):
            pulled.append(item[0])
            await asyncio.sleep(0)
            yield item

    with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=TIMEOUT_S) as sender:
        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        sender.accept(1)
        with pytest.raises(ferry.FerryError, match="the rollout's loader failed"):
            asyncio.run(sender.send_round_streamed_async(_specs(weights), generate()))
        thread.join(TIMEOUT_S)
    assert len(pulled) < len(weights), "the loop stopped pulling once the round failed"

"""ferry.Relay: a net sender's receiver that republishes over shm, run from Python."""

from __future__ import annotations

import os
import threading
import time

import pytest

import ferry
from conftest import unique_address

STOP_BOUND_S = 5.0  # stop() is heard within about 100 ms; the relay's timeout is 30 s


def _token(path) -> str:
    path.write_text(os.urandom(32).hex())  # as `ferry token new` makes: 256 random bits
    path.chmod(0o600)
    return str(path)


def test_stop_from_another_thread_ends_the_relays_wait(tmp_path):
    from ferry.verl.checkpoint_engine import _free_port

    token = _token(tmp_path / "token")
    upstream = f"127.0.0.1:{_free_port('127.0.0.1')}"
    with ferry.Sender(upstream, bucket_bytes=1 << 20, timeout=30, token_file=token) as sender:
        joined = threading.Thread(target=sender.accept, args=(1,))
        joined.start()
        relay = ferry.Relay(upstream, 0, unique_address(), timeout=30, token_file=token)
        joined.join(30)
        assert sender.receivers == 1 and relay.session_id == sender.session_id
        errors: list[Exception] = []

        def wait_for_local_receivers() -> None:
            try:
                relay.accept(1)  # none ever comes
            except ferry.FerryError as e:
                errors.append(e)

        waiter = threading.Thread(target=wait_for_local_receivers)
        waiter.start()
        time.sleep(0.3)
        with pytest.raises(ferry.FailedPreconditionError, match="in use by another thread"):
            relay.relay_round()  # one call at a time
        start = time.monotonic()
        relay.stop()
        waiter.join(STOP_BOUND_S)
        assert not waiter.is_alive(), "stop() did not end accept()"
        assert time.monotonic() - start < STOP_BOUND_S
        assert len(errors) == 1 and isinstance(errors[0], ferry.AbortedError), errors
        assert "the relay was stopped" in str(errors[0])
        relay.close()
        assert relay.closed


def test_relay_needs_an_upstream_on_another_node_and_known_transports():
    with pytest.raises(ferry.InvalidArgumentError, match="not a host:port address"):
        ferry.Relay("@not-net", 0, unique_address(), timeout=1)
    with pytest.raises(ferry.InvalidArgumentError,
                       match="unknown transport scheme 'rdma' in address 'rdma://10.0.0.1:1'"):
        ferry.Relay("127.0.0.1:1", 0, "rdma://10.0.0.1:1", timeout=1)


def test_a_relay_feeds_a_relay_bit_exact(tmp_path):
    """sender -> relay 0 (serves relays) -> relay 1 -> a receiver on relay 1's node."""
    import torch

    from ferry.verl.checkpoint_engine import _free_port

    token = _token(tmp_path / "token")
    upstream = f"127.0.0.1:{_free_port('127.0.0.1')}"
    rounds = [{f"w{i}": torch.randn(300 + 97 * i, generator=torch.Generator().manual_seed(10 * r + i))
               for i in range(4)} for r in range(2)]
    errors: list[BaseException] = []
    got: list[dict] = []

    def run(target) -> threading.Thread:
        def body() -> None:
            try:
                target()
            except BaseException as e:  # reported by the test
                errors.append(e)
        t = threading.Thread(target=body)
        t.start()
        return t

    with ferry.Sender(upstream, bucket_bytes=4096, timeout=30, token_file=token) as sender:
        joined = run(lambda: sender.accept(1))
        first = ferry.Relay(upstream, 0, unique_address(), timeout=30, token_file=token,
                            relays_address="127.0.0.1:0")
        assert first.relays_address.startswith("127.0.0.1:")
        assert not first.relays_address.endswith(":0")

        def first_forwards() -> None:
            first.accept(0, downstream_relays=1)
            for _ in rounds:
                first.relay_round()

        forwarding = run(first_forwards)
        second = ferry.Relay(first.relays_address, 1, unique_address(), timeout=30,
                             token_file=token)
        assert second.relays_address == ""

        def second_forwards() -> None:
            second.accept(1)
            for _ in rounds:
                second.relay_round()

        forwarding_on = run(second_forwards)

        def receive() -> None:
            receiver = ferry.Receiver(second.local_address, 0, timeout=30)
            for _ in rounds:
                this: dict = {}
                receiver.receive_round(lambda name, t: this.__setitem__(name, t.clone()))
                got.append(this)

        receiving = run(receive)
        joined.join(30)
        for weights in rounds:
            sender.send_round(weights)
        for t in (forwarding, forwarding_on, receiving):
            t.join(30)
    assert not errors, errors
    assert len(got) == len(rounds)
    for sent, received in zip(rounds, got):
        assert sorted(received) == sorted(sent)
        for name, tensor in sent.items():
            assert torch.equal(received[name], tensor), name
    first.close()
    second.close()


"""ferry.MultiReceiver and ferry.split_into_parts: several trainer ranks each send a disjoint
part of the weights, and a rollout rank receives the union as one round. The full-depth test
sends every tensor of qwen2.5-0.5b (290, 0.99 GB bf16) from two senders."""

from __future__ import annotations

import threading

import pytest
import torch

import ferry
from conftest import unique_address
from weights import make_weights

PRESET = "qwen2.5-0.5b"
BUCKET = 64 << 20
TIMEOUT_S = 60


def _nbytes(dtype, shape) -> int:
    return ferry.tensor_bytes(dtype, list(shape))


def _serve(address: str, weights: list, errors: list, step: int = 7, rounds: int = 1) -> None:
    """A trainer rank: one Sender, one receiver, `rounds` rounds of `weights`."""
    try:
        with ferry.Sender(address, bucket_bytes=BUCKET, timeout=TIMEOUT_S) as sender:
            sender.accept(1)
            for _ in range(rounds):
                sender.send_round(weights, step=step)
    except ferry.FerryError as e:
        errors.append(e)


def _start(weights_per_sender: list[list], **kwargs) -> tuple[list[str], list, list]:
    addresses = [unique_address() for _ in weights_per_sender]
    errors: list = []
    threads = [threading.Thread(target=_serve, args=(a, w, errors), kwargs=kwargs)
               for a, w in zip(addresses, weights_per_sender)]
    for t in threads:
        t.start()
    return addresses, threads, errors


def test_parts_carry_equal_bytes_and_do_not_depend_on_the_order_given():
    specs = ferry.hf_tensor_specs(PRESET, ferry.DType.BF16)
    assert len(specs) == 290
    total = sum(_nbytes(d, s) for _, d, s in specs)
    for senders in (2, 4, 8):
        parts = ferry.split_into_parts(specs, senders)
        indices = sorted(i for part in parts for i in part)
        assert indices == list(range(len(specs)))  # disjoint, and every tensor sent
        # Each sender's link carries 1/S of the model within 1%, but whole tensors: a tensor
        # larger than 1/S (qwen2.5-0.5b's 272 MB embedding from S = 4 on) is a part alone,
        # and the other parts share the rest within 1%.
        alone = [p for p in parts if len(p) == 1
                 and _nbytes(specs[p[0]][1], specs[p[0]][2]) > total / senders]
        rest = total - sum(_nbytes(specs[p[0]][1], specs[p[0]][2]) for p in alone)
        share = rest / (senders - len(alone))
        for part in parts:
            if part in alone:
                continue
            nbytes = sum(_nbytes(specs[i][1], specs[i][2]) for i in part)
            assert abs(nbytes - share) <= 0.01 * share, (senders, nbytes, share)
        assert len(alone) == (0 if senders == 2 else 1)
        shuffled = list(reversed(specs))
        again = ferry.split_into_parts(shuffled, senders)
        by_name = [sorted(shuffled[i][0] for i in part) for part in again]
        assert by_name == [sorted(specs[i][0] for i in part) for part in parts]
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.split_into_parts(specs, 0)


def test_two_senders_deliver_a_full_depth_model_bit_exact_into_destinations():
    specs = ferry.hf_tensor_specs(PRESET, ferry.DType.BF16)
    g = torch.Generator().manual_seed(11)
    weights = [(name, torch.empty(shape, dtype=torch.bfloat16).uniform_(-1, 1, generator=g))
               for name, _, shape in specs]
    parts = ferry.split_into_parts(specs, 2)
    addresses, threads, errors = _start([[weights[i] for i in part] for part in parts])
    with ferry.MultiReceiver(addresses, 0, timeout=TIMEOUT_S) as rx:
        got = {name: torch.zeros_like(t) for name, t in weights}
        rx.set_destinations(got)
        stats = rx.receive_round_into()
        per_sender = rx.sender_stats
    for t in threads:
        t.join(TIMEOUT_S)
    assert not errors, errors
    assert stats.tensors == 290 and stats.step == 7
    assert stats.bytes == sum(t.numel() * 2 for _, t in weights)
    for part, sent in zip(parts, per_sender):
        assert sent.tensors == len(part)
        assert sent.bytes == sum(weights[i][1].numel() * 2 for i in part)
    assert all(torch.equal(got[name], t) for name, t in weights)


def test_per_tensor_delivery_gets_every_tensor_of_every_sender_once():
    weights = make_weights(0)
    specs = [(name, t.dtype, tuple(t.shape)) for name, t in weights]
    parts = ferry.split_into_parts(specs, 3)
    addresses, threads, errors = _start([[weights[i] for i in part] for part in parts])
    received: dict[str, torch.Tensor] = {}

    def on_tensor(name: str, tensor: torch.Tensor) -> None:
        assert name not in received
        received[name] = tensor.clone()

    with ferry.MultiReceiver(addresses, 0, timeout=TIMEOUT_S) as rx:
        rx.receive_round(on_tensor)
    for t in threads:
        t.join(TIMEOUT_S)
    assert not errors, errors
    assert set(received) == {name for name, _ in weights}
    for name, t in weights:
        assert torch.equal(received[name], t.contiguous()), name


def test_a_tensor_two_senders_send_is_refused_naming_it_and_both_senders():
    weights = make_weights(1)
    shared = weights[0]
    addresses, threads, _ = _start([weights[:10], [shared] + weights[10:20]])
    with ferry.MultiReceiver(addresses, 0, timeout=TIMEOUT_S) as rx:
        with pytest.raises(ferry.InvalidArgumentError) as e:
            rx.receive_round(lambda name, tensor: None)
    for t in threads:
        t.join(TIMEOUT_S)
    assert f"'{shared[0]}'" in str(e.value)
    assert addresses[0] in str(e.value) and addresses[1] in str(e.value)


def test_a_sender_that_dies_is_named_and_the_next_update_works():
    weights = make_weights(2)
    first, second = weights[:100], weights[100:]
    dead = unique_address()
    errors: list = []
    live = unique_address()
    alive = threading.Thread(target=_serve, args=(live, first, errors))
    alive.start()

    def die() -> None:  # joins, then goes away without a round
        with ferry.Sender(dead, bucket_bytes=BUCKET, timeout=TIMEOUT_S) as sender:
            sender.accept(1)

    dying = threading.Thread(target=die)
    dying.start()
    with ferry.MultiReceiver([live, dead], 0, timeout=TIMEOUT_S) as rx:
        with pytest.raises(ferry.FerryError) as e:
            rx.receive_round(lambda name, tensor: None)
    alive.join(TIMEOUT_S)
    dying.join(TIMEOUT_S)
    assert dead in str(e.value), e.value
    # The next update: both trainer ranks serve again, a new MultiReceiver joins them.
    addresses, threads, errors = _start([first, second])
    with ferry.MultiReceiver(addresses, 0, timeout=TIMEOUT_S) as rx:
        names: list[str] = []
        stats = rx.receive_round(lambda name, tensor: names.append(name))
    for t in threads:
        t.join(TIMEOUT_S)
    assert not errors, errors
    assert sorted(names) == sorted(name for name, _ in weights) and stats.step == 7


def test_multi_receiver_takes_receiver_options_only():
    with pytest.raises(TypeError, match="bucket_bytes"):
        ferry.MultiReceiver(["@a", "@b"], 0, bucket_bytes=1)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.MultiReceiver([], 0, timeout=1)


def _serve_rounds(address: str, rounds: list[list], step: int, errors: list) -> None:
    """A trainer rank sending one update as `rounds` (every round but the last says more
    follow), as send_update stages a part."""
    try:
        with ferry.Sender(address, bucket_bytes=BUCKET, timeout=TIMEOUT_S) as sender:
            sender.accept(1)
            for i, weights in enumerate(rounds):
                sender.send_round(weights, more_follows=i + 1 < len(rounds), step=step)
    except ferry.FerryError as e:
        errors.append(e)


def _start_rounds(parts: list[tuple[list[list], int]]) -> tuple[list[str], list, list]:
    addresses = [unique_address() for _ in parts]
    errors: list = []
    threads = [threading.Thread(target=_serve_rounds, args=(a, rounds, step, errors))
               for a, (rounds, step) in zip(addresses, parts)]
    for t in threads:
        t.start()
    return addresses, threads, errors


def test_receive_update_takes_parts_split_into_different_numbers_of_rounds():
    """receive_update (the verl backend's several senders): one sender's part in three rounds,
    the other's in one, the same step: every tensor once, the stats summed per sender."""
    weights = make_weights(3)
    first, second = weights[:30], weights[30:]
    addresses, threads, errors = _start_rounds(
        [([first[:10], first[10:20], first[20:]], 9), ([second], 9)])
    received: dict[str, torch.Tensor] = {}

    def on_tensor(name: str, tensor: torch.Tensor) -> None:
        assert name not in received
        received[name] = tensor.clone()

    with ferry.MultiReceiver(addresses, 0, timeout=TIMEOUT_S) as rx:
        stats = rx.receive_update(on_tensor)
        per_sender = rx.sender_stats
    for t in threads:
        t.join(TIMEOUT_S)
    assert not errors, errors
    assert stats.tensors == len(weights) and stats.step == 9 and not stats.more_follows
    assert [s.tensors for s in per_sender] == [len(first), len(second)]
    for name, t in weights:
        assert torch.equal(received[name], t.contiguous()), name


def test_receive_update_refuses_rounds_of_two_steps_naming_both_senders():
    """A later round of one sender carrying another step than the other sender's update (two
    updates mixed) fails before its tensors are delivered, naming both senders."""
    weights = make_weights(4)
    addresses, threads, errors = _start_rounds(
        [([weights[:10], weights[10:20]], 5), ([weights[20:30]], 6)])
    with ferry.MultiReceiver(addresses, 0, timeout=TIMEOUT_S) as rx:
        with pytest.raises(ferry.FailedPreconditionError) as e:
            rx.receive_update(lambda name, tensor: None)
    for t in threads:
        t.join(TIMEOUT_S)
    message = str(e.value)
    assert "step 5" in message and "step 6" in message, message
    assert addresses[0] in message and addresses[1] in message, message

"""Delta rounds from Python: SyncOptions(delta=...) and a sender whose later rounds carry
only what changed, received through verl's per-bucket callback, every byte checked."""

from __future__ import annotations

import pytest

from conftest import digest, run_peers, unique_address
from weights import BUCKET_BYTES, make_weights

ROUNDS = 3


def test_sync_options_delta_names_a_mode_and_refuses_others():
    import ferry

    assert ferry.SyncOptions().delta == "off"
    opts = ferry.SyncOptions(delta="auto")
    assert opts.delta == "auto"
    assert "delta='auto'" in repr(opts)
    with pytest.raises(ferry.InvalidArgumentError, match="delta mode 'yes'"):
        opts.delta = "yes"


def _updates():
    """Round 0's weights, then two updates that each change one element per tensor."""
    weights = make_weights(0)
    rounds = [[(n, t.clone()) for n, t in weights]]
    for r in range(1, ROUNDS):
        changed = []
        for name, t in rounds[-1]:
            t = t.contiguous().clone()
            if t.numel() > 0:
                t.view(-1)[min(r, t.numel() - 1)] += 1
            changed.append((name, t))
        rounds.append(changed)
    return rounds


def _sender(address: str, queue) -> None:
    import ferry

    try:
        with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=60, delta="on") as sender:
            sender.accept(1)
            stats, sums = [], []
            for weights in _updates():
                s = sender.send_round(weights)
                stats.append((s.delta, s.wire_bytes, s.bytes, s.version))
                sums.append({name: digest(t) for name, t in weights})
            queue.put(("ok", stats, sums))
    except Exception as e:  # reported to the test, not lost in the child
        queue.put(("error", type(e).__name__, str(e)))


def _receiver(address: str, queue) -> None:
    import ferry

    try:
        receiver = ferry.Receiver(address, 0, timeout=60)
        rounds = []
        for _ in range(ROUNDS):
            sums = {}

            def on_bucket(weights, is_last):
                for name, t in weights:
                    sums[name] = digest(t)

            s = receiver.receive_round_buckets(on_bucket)
            rounds.append((s.delta, sums))
        queue.put(("ok", rounds))
        receiver.close()
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def test_delta_rounds_are_bit_exact_and_small():
    address = unique_address()
    sent, received = run_peers((_sender, address), (_receiver, address))
    assert sent[0] == "ok", sent
    assert received[0] == "ok", received
    _, stats, sent_sums = sent
    _, rounds = received
    assert [s[0] for s in stats] == [False, True, True]
    assert [r[0] for r in rounds] == [False, True, True]
    for delta, wire_bytes, nbytes, _ in stats[1:]:
        assert wire_bytes * 10 < nbytes
    for r in range(ROUNDS):
        assert rounds[r][1] == sent_sums[r], f"round {r + 1}: wrong bytes"


def test_sync_options_delta_keep_limit_defaults_to_64_gib():
    import ferry

    assert ferry.SyncOptions().delta_keep_limit == 64 << 30
    opts = ferry.SyncOptions(delta_keep_limit=1000)
    assert opts.delta_keep_limit == 1000
    assert "delta_keep_limit=1000" in repr(opts)
    opts.delta_keep_limit = 5
    assert opts.delta_keep_limit == 5


def _model_bytes() -> int:
    return sum(t.numel() * t.element_size() for _, t in make_weights(0))


def _sender_twice(address: str, queue) -> None:
    """A delta sender whose first session fails, then serves a second one."""
    import ferry

    try:
        with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=60, delta="on") as sender:
            sender.accept(1)
            try:
                sender.send_round(make_weights(0))
                first = "ok"
            except ferry.FerryError as e:
                first = str(e)
            sender.accept(1)
            s = sender.send_round(make_weights(1))
            queue.put(("ok", first, s.delta))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def _receiver_short_then_enough(address: str, queue) -> None:
    """Joins with a keep limit one byte short of the model, then again with room for it."""
    import ferry

    try:
        short = ferry.SyncOptions(timeout=60, idle_timeout=-1, delta_keep_limit=_model_bytes() - 1)
        receiver = ferry.Receiver(address, 0, options=short)
        try:
            receiver.receive_round_buckets(lambda weights, is_last: None)
            refused = ("ok",)
        except ferry.FerryError as e:
            refused = (type(e).__name__, str(e))
        receiver.close()
        enough = ferry.SyncOptions(timeout=60, idle_timeout=-1, delta_keep_limit=_model_bytes())
        receiver = ferry.Receiver(address, 0, options=enough)
        sums = {}

        def on_bucket(weights, is_last):
            for name, t in weights:
                sums[name] = digest(t)

        receiver.receive_round_buckets(on_bucket)
        receiver.close()
        queue.put(("ok", refused, sums))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def test_delta_keep_limit_refuses_a_round_past_it_and_the_next_session_works():
    address = unique_address()
    sent, received = run_peers((_sender_twice, address), (_receiver_short_then_enough, address))
    assert sent[0] == "ok", sent
    assert received[0] == "ok", received
    _, first, second_delta = sent
    _, refused, sums = received
    assert refused[0] == "ResourceExhaustedError", refused
    assert "delta_keep_limit" in refused[1], refused
    assert f"limit of {_model_bytes() - 1} bytes" in refused[1], refused
    assert first != "ok" and "delta_keep_limit" in first, first
    assert second_delta is False
    assert sums == {name: digest(t) for name, t in make_weights(1)}


def test_sync_options_max_assembled_tensor_bytes_defaults_below_this_machines_memory():
    """The bound on a tensor spanning buckets that a callback receiver assembles: a quarter of
    this machine's memory (at least 1 GiB), at most 64 GiB (issue 31: 64 GiB on a 23 GB machine
    let a sender make a receiver fault in more than the machine has)."""
    import os

    import ferry

    machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    default = ferry.SyncOptions().max_assembled_tensor_bytes
    assert default < machine
    assert default == min(64 << 30, max(1 << 30, machine // 4))
    assert ferry.SyncOptions().max_ring_bytes == min(16 << 30, max(1 << 30, machine // 4))
    assert ferry.SyncOptions(max_assembled_tensor_bytes=4096).max_assembled_tensor_bytes == 4096


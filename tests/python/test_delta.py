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

"""ferry.Sender / ferry.Receiver between spawned processes: three rounds in one session,
one per delivery mode, every byte checked."""

from __future__ import annotations

import torch

from conftest import digest, run_peers, unique_address
from weights import BUCKET_BYTES, make_weights

ROUNDS = 3


def _sender(address: str, queue) -> None:
    import ferry

    try:
        with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=60) as sender:
            sender.accept(1)
            stats, sums = [], []
            for r in range(ROUNDS):
                weights = make_weights(r)
                s = sender.send_round(weights)
                stats.append((s.round, s.tensors, s.buckets, s.bytes, s.checksum))
                sums.append({name: digest(t) for name, t in weights})
            queue.put(("ok", stats, sums, sender.session_id))
    except Exception as e:  # reported to the test, not lost in the child
        queue.put(("error", type(e).__name__, str(e)))


def _receiver(address: str, queue) -> None:
    import ferry

    try:
        receiver = ferry.Receiver(address, 0, timeout=60)
        rounds = []
        # Round 1: per-bucket callback (verl's shape).
        sums, order, last_flags = {}, [], []

        def on_bucket(weights, is_last):
            last_flags.append(is_last)
            for name, t in weights:
                order.append(name)
                sums[name] = digest(t)

        s = receiver.receive_round_buckets(on_bucket)
        rounds.append((s.round, s.buckets, s.checksum, sums, order, last_flags))
        # Round 2: per-tensor callback.
        sums, order = {}, []

        def on_tensor(name, t):
            order.append(name)
            sums[name] = digest(t)

        s = receiver.receive_round(on_tensor)
        rounds.append((s.round, s.buckets, s.checksum, sums, order, None))
        # Round 3: straight into registered destinations.
        dest = {name: torch.empty(t.shape, dtype=t.dtype) for name, t in make_weights(2)}
        receiver.set_destinations(dest)
        s = receiver.receive_round_into()
        rounds.append((s.round, s.buckets, s.checksum, {n: digest(t) for n, t in dest.items()},
                       None, None))
        queue.put(("ok", rounds, receiver.session_id))
        receiver.close()
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def test_three_rounds_three_modes_across_processes():
    address = unique_address()
    sent, received = run_peers((_sender, address), (_receiver, address))
    assert sent[0] == "ok", sent
    assert received[0] == "ok", received
    _, stats, sent_sums, sender_session = sent
    _, rounds, receiver_session = received
    assert sender_session == receiver_session
    names = [name for name, _ in make_weights(0)]
    for r in range(ROUNDS):
        round_no, tensors, buckets, nbytes, checksum = stats[r]
        got_round, got_buckets, got_checksum, got_sums, order, last_flags = rounds[r]
        assert (round_no, buckets, checksum) == (got_round, got_buckets, got_checksum)
        assert tensors == len(names)
        assert buckets > 1 and nbytes > BUCKET_BYTES
        assert got_sums.keys() == sent_sums[r].keys()
        bad = [n for n in names if got_sums[n] != sent_sums[r][n]]
        assert not bad, f"round {r + 1}: wrong bytes for {bad}"
        if order is not None:
            assert order == names, "tensors must arrive in send order"
        if last_flags is not None:
            assert last_flags == [False] * (buckets - 1) + [True]

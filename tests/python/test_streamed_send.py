"""ferry.Sender.send_round_streamed between spawned processes: tensors pulled from a
generator one at a time into the ring (a generator refilling one buffer stays correct),
and what aborts a round: a tensor differing from the manifest, or the generator raising."""

from __future__ import annotations


from conftest import digest, run_peers, unique_address
from weights import BUCKET_BYTES, from_one_buffer as _from_one_buffer, make_weights, \
    specs_of as _specs


def _raising(weights, at: int):
    for i, item in enumerate(weights):
        if i == at:
            raise ValueError(f"the generator failed at {item[0]}")
        yield item


def _sender(address: str, case: str, queue) -> None:
    import ferry

    weights = make_weights(0)
    try:
        with ferry.Sender(address, bucket_bytes=BUCKET_BYTES, timeout=60) as sender:
            sender.accept(1)
            if case == "ok":
                stats = sender.send_round_streamed(_specs(weights), _from_one_buffer(weights))
                queue.put(("ok", stats.tensors, {name: digest(t) for name, t in weights}))
                return
            if case == "renamed":
                items = [("other" if n == "norm.fp16" else n, t) for n, t in weights]
            else:
                items = _raising(weights, 5)
            sender.send_round_streamed(_specs(weights), items)
            queue.put(("ok", "the round was not aborted"))
    except Exception as e:  # reported to the test, not lost in the child
        queue.put(("error", type(e).__name__, str(e)))


def _receiver(address: str, queue) -> None:
    import ferry

    try:
        receiver = ferry.Receiver(address, 0, timeout=60)
        sums = {}
        receiver.receive_round(lambda name, t: sums.__setitem__(name, digest(t)))
        queue.put(("ok", sums))
    except Exception as e:
        queue.put(("error", type(e).__name__, str(e)))


def test_streamed_round_from_a_generator_refilling_one_buffer_is_bit_exact():
    address = unique_address()
    sent, received = run_peers((_sender, address, "ok"), (_receiver, address))
    assert sent[0] == "ok", sent
    assert received[0] == "ok", received
    assert sent[1] == len(make_weights(0))
    assert received[1] == sent[2]


def test_a_tensor_differing_from_the_manifest_aborts_the_round_naming_it():
    address = unique_address()
    sent, received = run_peers((_sender, address, "renamed"), (_receiver, address))
    assert sent[:2] == ("error", "InvalidArgumentError"), sent
    assert "tensor 1 is 'other' F16[1000], but the manifest has 'norm.fp16'" in sent[2], sent
    assert received[0] == "error", received  # never delivered as a round


def test_an_exception_in_the_generator_is_raised_unchanged_and_aborts_the_round():
    address = unique_address()
    sent, received = run_peers((_sender, address, "raising"), (_receiver, address))
    assert sent == ("error", "ValueError", "the generator failed at next.bf16"), sent
    assert received[0] == "error", received
    assert "ValueError" in received[2], received  # the receiver hears why

"""Waiting for a peer from Python (issue #15 item 6): Ctrl-C while a Receiver waits for its
sender raises KeyboardInterrupt, a missing sender is a TimeoutError naming the address, and
every timeout message gives the timeout the caller passed."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

import ferry
from conftest import unique_address


def _interrupt_soon(delay_s: float = 0.5) -> threading.Timer:
    timer = threading.Timer(delay_s, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_while_receiver_waits_for_a_sender_raises_keyboard_interrupt():
    # Nobody listens at the address yet: the receiver retries until its timeout (20 s).
    start = time.monotonic()
    _interrupt_soon()
    with pytest.raises(KeyboardInterrupt):
        ferry.Receiver(unique_address(), 0, timeout=20)
    assert time.monotonic() - start < 10, "Ctrl-C waited for the connect timeout"

    # A sender is up but not in accept(): the receiver waits for its answer.
    with ferry.Sender(unique_address(), bucket_bytes=64 << 10, timeout=20) as sender:
        start = time.monotonic()
        _interrupt_soon()
        with pytest.raises(KeyboardInterrupt):
            ferry.Receiver(sender.address, 0, timeout=20)
        assert time.monotonic() - start < 10, "Ctrl-C waited for the answer timeout"


def test_receiver_without_sender_times_out_naming_the_address():
    address = unique_address()
    start = time.monotonic()
    with pytest.raises(ferry.TimeoutError) as info:
        ferry.Receiver(address, 0, timeout=0.5)
    # It retried for its whole timeout (a sender may start later), not failed at once.
    assert time.monotonic() - start >= 0.45
    assert address in str(info.value) and "within 500 ms" in str(info.value), info.value
    assert isinstance(info.value, TimeoutError)


@pytest.mark.parametrize("timeout_s", [0.3, 1.0])
def test_timeout_messages_give_the_timeout_passed(timeout_s):
    want = f"within {int(timeout_s * 1000)} ms"
    with ferry.Sender(unique_address(), bucket_bytes=64 << 10, timeout=timeout_s) as sender:
        with pytest.raises(ferry.TimeoutError, match=want):
            sender.accept(1)
        # Up but not accepting: the receiver's wait for an answer gives its own timeout.
        with pytest.raises(ferry.TimeoutError, match=want):
            ferry.Receiver(sender.address, 0, timeout=timeout_s)
    with pytest.raises(ferry.TimeoutError, match=want):
        ferry.Receiver(unique_address(), 0, timeout=timeout_s)

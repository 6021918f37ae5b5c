#!/usr/bin/env python3
"""Writes fuzz/corpus/transport_tcp_stream_fuzz/ (run it by hand after changing the records).

Each seed is the fuzz target's records (transport_tcp_stream_fuzz.cc): 0 a frame the target
seals (kind, length, payload), 1 raw bytes (length, bytes), 2 a receive (key, capacity / 16),
3 a turn of the channel's side. Frame kinds: 0 message, 1 FIN, 2 ANNOUNCE, 3 READY, 4 DATA.
"""
import os
import struct
import sys


def frame(kind, payload):
    return bytes([0, kind, len(payload)]) + payload


def raw(data):
    return bytes([1, len(data)]) + data


def receive(key, sixteenths):
    return bytes([2, key, sixteenths])


TURN = bytes([3])


def announce(key, size, protect=0):
    return frame(2, struct.pack("<IBQ", key, protect, size) + bytes(16))


def data(key, size):
    return frame(4, struct.pack("<IQ", key, size))


SEEDS = {
    "honest_bulk": receive(0, 4) + announce(0, 64) + TURN + data(0, 64) + raw(bytes(range(64))) + TURN,
    "bulk_before_receive": announce(2, 48) + TURN + receive(2, 3) + TURN + data(2, 48) + raw(b"\x5a" * 48) + TURN,
    "messages_then_fin": frame(0, b"hello") + TURN + frame(0, b"") + frame(1, b"") + TURN,
    "ready_never_announced": frame(3, struct.pack("<I", 9)) + TURN,
    "data_not_asked_for": data(1, 16) + raw(bytes(16)) + TURN,
    "larger_than_posted": receive(1, 0) + announce(1, 32) + TURN + data(1, 32) + raw(bytes(32)) + TURN,
    "mac_announced_bytes_unsealed": receive(3, 2) + announce(3, 32, protect=1) + TURN + data(3, 32) + raw(bytes(32)) + TURN,
    "cut_mid_bulk": receive(0, 8) + announce(0, 128) + TURN + data(0, 128) + raw(bytes(40)) + TURN,
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus",
                       "transport_tcp_stream_fuzz")
    os.makedirs(out, exist_ok=True)
    for name, seed in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(seed)
    print(f"wrote {len(SEEDS)} seeds to {os.path.normpath(out)}", file=sys.stderr)


if __name__ == "__main__":
    main()

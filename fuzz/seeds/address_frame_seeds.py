#!/usr/bin/env python3
"""Writes fuzz/corpus/transport_address_frame_fuzz/ (run it by hand after changing the frame).

The session is the fuzz target's: its token, connector nonce 32 x 0x01, listener nonce
32 x 0x02, public keys 32 x 0x04 and 32 x 0x05, ephemeral X25519 secret 32 x 0x03. Each seed's first byte picks the target's mode (even: a frame as it arrives; odd:
a worker address the target seals itself). Needs python3-cryptography.
"""
import os
import struct
import sys

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

TOKEN = b"595e0ea72283ceaab9fff7db4dce494ff27fb0f69d2243874ffce94b5e27303f"
INFO = (b"ferry wire v2 x25519: control c>l, control l>c, bulk c>l, bulk l>c, address c>l, "
        b"address l>c")
MAGIC, VERSION, KIND_ADDRESS = 0x41595246, 2, 6


def connector_address_key():
    salt = b"\x01" * 32 + b"\x02" * 32 + b"\x04" * 32 + b"\x05" * 32
    okm = HKDF(algorithm=hashes.SHA256(), length=6 * 32, salt=salt,
               info=INFO).derive(b"\x03" * 32 + TOKEN)
    return okm[4 * 32:5 * 32]  # address c>l


def sealed_frame(worker):
    header = struct.pack("<IBBI", MAGIC, VERSION, KIND_ADDRESS, len(worker))
    nonce = bytes(12)  # counter 0
    return header + AESGCM(connector_address_key()).encrypt(nonce, worker, header)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.join(root, "corpus", "transport_address_frame_fuzz")
    os.makedirs(out, exist_ok=True)
    # Shaped like UCX 1.13's packed address: header (version 0, uuid flag), uuid, entries.
    worker = bytes([0x20]) + bytes(range(1, 9)) + bytes([0x00, 0x06]) + b"\x5a" * 53
    seeds = {
        "sealed_frame": b"\x00" + sealed_frame(worker),
        "sealed_frame_flipped": b"\x00" + bytearray(sealed_frame(worker))[:20] + b"\xff"
                                + sealed_frame(worker)[21:],
        "worker_address": b"\x01" + b"\x03" + worker,
        "worker_address_other_version": b"\x01" + b"\x05" + bytes([0x28]) + worker[1:],
        "worker_address_too_short": b"\x01" + b"\x00" + worker[:9],
    }
    # The handshake target's seeds (fuzz/corpus/transport_handshake_fuzz/): version 2.
    handshake = os.path.join(root, "corpus", "transport_handshake_fuzz")
    prefix = lambda kind: struct.pack("<IBB", MAGIC, VERSION, kind)
    for name, data in {"hello": prefix(1) + b"\x01" + b"\x11" * 32 + b"\x22" * 32,
                       "verdict": prefix(4) + b"\x00" + b"\x33" * 32 + struct.pack("<I", 7),
                       "address": sealed_frame(worker)}.items():
        with open(os.path.join(handshake, name), "wb") as f:
            f.write(data)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes(data))
    print(f"wrote {len(seeds)} seeds to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

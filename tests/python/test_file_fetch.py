"""ferry._ferry.FileServer and fetch_files: files fetched from another node over the net
transport (the checkpoint replication protocol's file-set mode), checked against the sizes
and XXH3s the fetching side holds."""

from __future__ import annotations

import os
import secrets
import time

import pytest

import ferry
from ferry import _ferry


def _token(path) -> str:
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return str(path)


def _write(root, rel: str, data: bytes) -> tuple[str, int, int]:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return (rel, len(data), _ferry.xxh3_file(str(path)))


def test_round_trip_of_two_files_with_a_token_file(tmp_path):
    token = _token(tmp_path / "token")
    src, dst = tmp_path / "src", tmp_path / "dst"
    big = os.urandom(3 * (1 << 20) + 5)
    files = [_write(src, "__0_0.distcp", big), _write(src, "model/.metadata", b"metadata")]
    with _ferry.FileServer(str(src), files, token_file=token) as server:
        assert server.address.startswith("127.0.0.1:") and not server.address.endswith(":0")
        fetched = _ferry.fetch_files(server.address, str(dst), files, token_file=token)
        assert fetched == len(big) + len(b"metadata")
        assert (dst / "__0_0.distcp").read_bytes() == big
        assert (dst / "model/.metadata").read_bytes() == b"metadata"
        # Both are there now: nothing is fetched again.
        assert _ferry.fetch_files(server.address, str(dst), files, token_file=token) == 0
    assert server.closed
    server.close()  # idempotent


def test_corruption_on_the_server_side_is_refused_and_named(tmp_path):
    token = _token(tmp_path / "token")
    src, dst = tmp_path / "src", tmp_path / "dst"
    data = os.urandom(100_000)
    entry = _write(src, "shard.distcp", data)
    flipped = bytearray(data)
    flipped[5_000] ^= 0xFF
    (src / "shard.distcp").write_bytes(bytes(flipped))  # same size, other bytes
    with _ferry.FileServer(str(src), [entry], token_file=token) as server:
        with pytest.raises(ferry.CorruptionError) as err:
            _ferry.fetch_files(server.address, str(dst), [entry], token_file=token)
        assert server.address in str(err.value)
        assert "shard.distcp" in str(err.value)
    assert not (dst / "shard.distcp").exists()
    assert not dst.exists() or not [p for p in dst.rglob("*") if ".tmp." in p.name]


def test_a_closed_server_is_refused_naming_its_address(tmp_path):
    token = _token(tmp_path / "token")
    src, dst = tmp_path / "src", tmp_path / "dst"
    entry = _write(src, "a.distcp", b"aaaa")
    server = _ferry.FileServer(str(src), [entry], token_file=token)
    address = server.address
    server.close()
    start = time.monotonic()
    with pytest.raises(ferry.FerryError) as err:
        _ferry.fetch_files(address, str(dst), [entry], token_file=token, timeout_ms=500)
    assert time.monotonic() - start < 10
    assert address in str(err.value)
    assert not (dst / "a.distcp").exists()


def test_bad_arguments_raise_the_ferry_errors(tmp_path):
    token = _token(tmp_path / "token")
    with pytest.raises(ferry.InvalidArgumentError):
        _ferry.FileServer(str(tmp_path), [("../escape", 1, 2)], token_file=token)
    with pytest.raises(ferry.NotFoundError):
        _ferry.FileServer(str(tmp_path / "absent"), [], token_file=token)
    with pytest.raises(ferry.NotFoundError):
        _ferry.xxh3_file(str(tmp_path / "absent"))
    assert _ferry.fetch_files("127.0.0.1:1", str(tmp_path / "dst"), [], token_file=token) == 0

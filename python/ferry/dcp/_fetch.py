"""Moving a checkpoint's files between nodes: ferry's replicate server and puller in their
file-set mode (docs/protocol.md, "Checkpoint replication"), over ferry's authenticated net
transport. The fetching side checks every byte against the size and XXH3 in its own node's
committed index, never against what the server claims; a file is renamed into place only
once it verified."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

from .. import _ferry
from ._index import FileEntry


def as_wire(entries: list[FileEntry]) -> list[tuple[str, int, int]]:
    return [(e.path, e.bytes, e.xxh3) for e in entries]


@contextmanager
def token_file(token: str | None = None) -> Iterator[tuple[str, str]]:
    """A private file (mode 0600, in a 0700 folder) holding `token`, or a fresh 256-bit one:
    (path, token). Removed on exit."""
    folder = tempfile.mkdtemp(prefix="ferry-dcp-")
    try:
        token = token or secrets.token_hex(32)
        path = os.path.join(folder, "token")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        yield path, token
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def serve(folder: str, entries: list[FileEntry], host: str, token_path: str) -> "_ferry.FileServer":
    """Starts serving `entries` of `folder` on `host` (a free port); the server's .address."""
    return serve_on(folder, entries, f"{host}:0", token_path)


def serve_on(folder: str, entries: list[FileEntry], address: str,
             token_path: str) -> "_ferry.FileServer":
    """As serve(), on "host:port"; token_path "" reads FERRY_TOKEN, else FERRY_TOKEN_FILE."""
    return _ferry.FileServer(folder, as_wire(entries), address, token_path)


def fetch(address: str, folder: str, entries: list[FileEntry], token_path: str,
          timeout_s: float) -> int:
    """Fetches `entries` from the server at `address` into `folder`; the bytes moved."""
    return _ferry.fetch_files(address, folder, as_wire(entries), token_path,
                              int(timeout_s * 1000))

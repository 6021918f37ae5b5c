"""What every node holds about a ferry.dcp checkpoint, beside DCP's own `.metadata`:

    .ferry-index.json   every file of the checkpoint: bytes, XXH3-64, the rank and host that
                        wrote it; the same bytes on every node
    .ferry-commit       written last on every node, once every node holds .metadata and the
                        index; names the index's XXH3 so that a torn or mixed folder is refused

A folder without .ferry-commit is a save that did not finish. The format is in
docs/checkpoint.md ("ferry.dcp").
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass

from .. import _ferry

INDEX = ".ferry-index.json"
COMMIT = ".ferry-commit"
METADATA = ".metadata"  # DCP's global metadata file name
FORMAT = "ferry-dcp"
VERSION = 1


class NotCommittedError(FileNotFoundError):
    """The folder holds no finished ferry.dcp save (on this node)."""


@dataclass(frozen=True)
class FileEntry:
    path: str   # a plain file name inside the checkpoint folder
    bytes: int
    xxh3: int
    rank: int   # the rank that wrote it (-1: replicated to every node, e.g. .metadata)
    host: str   # that rank's host name, for messages


@dataclass(frozen=True)
class Index:
    save_id: str
    world_size: int
    files: dict[str, FileEntry]     # by path; DCP's shard files and any replicated file
    replicated: tuple[str, ...]     # paths every node holds (.metadata, and Megatron's files)
    nodes: tuple[tuple[str, tuple[int, ...]], ...]  # (host, ranks) per storage node at save


def check_name(name: str) -> str:
    """A file name from an index or a plan: plain, inside the folder, never '..' or a path."""
    if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name
            or "\\" in name or "\0" in name or len(name) > 255):
        raise ValueError(f"ferry.dcp: {name!r} is not a plain file name inside the checkpoint "
                         "folder; the index or the plan is damaged")
    return name


def xxh3_file(path: str) -> int:
    return _ferry.xxh3_file(os.fspath(path))


def describe(path: str | os.PathLike) -> tuple[int, int]:
    """(bytes, XXH3-64) of a file, for the index."""
    return os.path.getsize(path), xxh3_file(path)


def write_atomic(folder: str | os.PathLike, name: str, data: bytes, fsync: bool = True) -> None:
    """Writes `name` in `folder` through a temporary file and a rename, so a reader sees the old
    file or the new one, never a torn one."""
    folder = os.fspath(folder)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, os.path.join(folder, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        sync_folder(folder)


def sync_folder(folder: str | os.PathLike) -> None:
    fd = os.open(os.fspath(folder), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode(index: Index) -> bytes:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "save_id": index.save_id,
        "world_size": index.world_size,
        "replicated": list(index.replicated),
        "nodes": [{"host": host, "ranks": list(ranks)} for host, ranks in index.nodes],
        "files": [{"path": e.path, "bytes": e.bytes, "xxh3": f"{e.xxh3:016x}", "rank": e.rank,
                   "host": e.host} for e in sorted(index.files.values(), key=lambda e: e.path)],
    }
    return (json.dumps(doc, indent=1) + "\n").encode()


def decode(data: bytes, where: str) -> Index:
    """Parses an index, checking every field; ValueError naming `where` and the field."""
    def bad(what: str) -> ValueError:
        return ValueError(f"ferry.dcp: {where}: {what}; the index is damaged")

    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise bad(f"not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise bad("not a ferry.dcp index")
    if doc.get("version") != VERSION:
        raise bad(f"version {doc.get('version')!r}, this ferry reads version {VERSION}")
    files: dict[str, FileEntry] = {}
    for item in _list(doc, "files", bad):
        try:
            entry = FileEntry(check_name(item["path"]), int(item["bytes"]),
                              int(item["xxh3"], 16), int(item["rank"]), str(item["host"]))
        except (KeyError, TypeError, ValueError) as e:
            raise bad(f"file entry {item!r}: {e}") from None
        if entry.bytes < 0 or entry.path in files:
            raise bad(f"file entry {item!r}: negative size or listed twice")
        files[entry.path] = entry
    replicated = tuple(check_name(p) for p in _list(doc, "replicated", bad))
    if any(p not in files for p in replicated):
        raise bad("a replicated file is not listed in files")
    try:
        nodes = tuple((str(n["host"]), tuple(int(r) for r in n["ranks"]))
                      for n in _list(doc, "nodes", bad))
        return Index(str(doc["save_id"]), int(doc["world_size"]), files, replicated, nodes)
    except (KeyError, TypeError, ValueError) as e:
        raise bad(str(e)) from None


def _list(doc: dict, key: str, bad) -> list:
    value = doc.get(key)
    if not isinstance(value, list):
        raise bad(f"'{key}' is missing or not a list")
    return value


def write_commit(folder: str | os.PathLike, index_bytes: bytes) -> None:
    marker = json.dumps({"format": FORMAT, "index_sha256": hashlib.sha256(index_bytes).hexdigest()})
    write_atomic(folder, COMMIT, (marker + "\n").encode())


def withdraw_commit(folder: str | os.PathLike) -> None:
    """Before a save rewrites a folder: it no longer holds a finished checkpoint."""
    try:
        os.unlink(os.path.join(os.fspath(folder), COMMIT))
    except FileNotFoundError:
        return
    sync_folder(folder)


def read_committed(folder: str | os.PathLike) -> Index:
    """The index of the finished save in `folder`; NotCommittedError when there is none here,
    ValueError when the marker and the index disagree or either is damaged."""
    folder = os.fspath(folder)
    try:
        with open(os.path.join(folder, COMMIT), "rb") as f:
            marker = f.read(4096)
    except FileNotFoundError:
        if os.path.exists(os.path.join(folder, METADATA)) and not os.path.exists(
                os.path.join(folder, INDEX)):
            raise NotCommittedError(
                f"{folder} holds a checkpoint that ferry.dcp did not write (no {INDEX}): load it "
                "with torch.distributed.checkpoint.FileSystemReader") from None
        raise NotCommittedError(
            f"{folder} has no finished ferry.dcp save on this node (no {COMMIT}): the save was "
            "interrupted or has not reached this node; load an earlier checkpoint") from None
    try:
        expected = str(json.loads(marker)["index_sha256"])
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise ValueError(f"ferry.dcp: {folder}/{COMMIT} is damaged") from None
    with open(os.path.join(folder, INDEX), "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != expected:
        raise ValueError(f"ferry.dcp: {folder}/{INDEX} does not match {COMMIT}: the folder "
                         "mixes two saves or the index was changed")
    return decode(data, f"{folder}/{INDEX}")

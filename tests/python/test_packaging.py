"""What a packaged ferry promises its users: docs on every compiled name, the typing marker,
and one version everywhere (the pip install itself: tests/install/check_pip_install.sh)."""

from __future__ import annotations

import inspect
import pathlib
import re
import types

import ferry
from ferry import _ferry

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]

# What pybind11 itself gives every enum (its int constructor, name, value): no docstring slot.
PYBIND_ENUM_ATTRIBUTES = {"__init__", "name", "value"}


def own_text(name: str, obj: object) -> str:
    """The docstring without pybind11's generated signature line(s)."""
    doc = inspect.getdoc(obj) or ""
    lines = [line for line in doc.splitlines() if not line.startswith(f"{name}(")]
    return "\n".join(lines).strip()


def public_compiled_names() -> list[tuple[str, object]]:
    """(qualified name, object) for every public function, class and class member of _ferry."""
    names = []
    for name, obj in vars(_ferry).items():
        if name.startswith("_"):
            continue
        names.append((name, obj))
        if not isinstance(obj, type) or issubclass(obj, BaseException):
            continue
        members = getattr(obj, "__members__", {})  # an enum's values share the class's doc
        for attr, raw in vars(obj).items():
            if attr.startswith("_") and attr != "__init__":
                continue
            if attr in members or (members and attr in PYBIND_ENUM_ATTRIBUTES):
                continue
            if isinstance(raw, types.WrapperDescriptorType):
                continue  # no constructor bound: the C slot's generic __init__
            names.append((f"{name}.{attr}", getattr(obj, attr)))
    return names


def test_every_public_compiled_name_has_a_docstring():
    names = public_compiled_names()
    assert len(names) > 40, [n for n, _ in names]  # the walk found the classes' members
    missing = [name for name, obj in names if not own_text(name.split(".")[-1], obj)]
    assert not missing, f"compiled names without a docstring: {missing}"


def test_sync_options_and_round_stats_document_their_fields():
    for name in ("bucket_bytes", "slots", "timeout", "idle_timeout", "checksums", "wire_protect",
                 "token_file"):
        assert own_text(name, getattr(ferry.SyncOptions, name)), name
    for name in ("round", "tensors", "buckets", "bytes", "seconds", "checksum", "more_follows"):
        assert own_text(name, getattr(ferry.RoundStats, name)), name
    # The constructor's signature names its keyword arguments and their defaults.
    signature = inspect.getdoc(ferry.SyncOptions.__init__).splitlines()[0]
    # (pybind11 3 spells an int parameter "typing.SupportsInt | typing.SupportsIndex")
    assert re.search(r"bucket_bytes: [^=]*\bSupportsInt\b[^=]* = 536870912|"
                     r"bucket_bytes: int = 536870912", signature), signature


def test_package_is_typed():
    assert (pathlib.Path(ferry.__file__).parent / "py.typed").is_file()


def test_version_is_cmakes_project_version():
    cmake = (SOURCE_DIR / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*ferry\s+VERSION\s+([0-9.]+)", cmake)
    assert match, "CMakeLists.txt has no project(ferry VERSION ...)"
    assert ferry.__version__ == match.group(1)

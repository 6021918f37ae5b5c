"""ferry.SyncOptions is made from the C++ option tables (include/ferry/sync_option_fields.h):
every field of every role is a keyword, a documented property and part of the repr, and
Sender, Receiver and Relay take their roles' fields as keywords (issue 32 item 3: three
options could not be set from Python and the repr showed 9 of 14)."""

from __future__ import annotations

import inspect
import math
import threading

import pytest
import torch

import ferry
from ferry import _ferry, sync
from conftest import unique_address

FIELDS = _ferry.sync_option_fields()
BOUND = [(name, role, kind) for name, role, kind, _ in FIELDS if kind != "not bound"]

# A value unlike the default, for each kind of field.
SAMPLES = {"bytes": 12345 << 4, "count": 3, "seconds": 2.5, "bool": False, "string": "/tmp/tok",
           "wire_protect": "mac", "delta_mode": "auto"}


def _properties(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items()
            if not name.startswith("_") and isinstance(value, property)}


def test_fields_come_in_three_roles_and_only_the_callback_is_not_bound():
    assert [role for role in dict.fromkeys(role for _, role, _, _ in FIELDS)] == [
        "session", "sender", "receiver"]
    assert [(name, role) for name, role, kind, _ in FIELDS if kind == "not bound"] == [
        ("interrupt", "session")]
    assert {kind for _, _, kind in BOUND} == set(SAMPLES)
    names = [name for name, _, _, _ in FIELDS]
    assert len(names) == len(set(names)), names


def test_every_field_is_a_documented_property_and_every_property_a_field():
    for name, _, _, doc in FIELDS:
        if name == "interrupt":
            assert not hasattr(ferry.SyncOptions, name)
            continue
        assert inspect.getdoc(getattr(ferry.SyncOptions, name)) == doc, name
    assert _properties(ferry.SyncOptions) == {name for name, _, _ in BOUND}


@pytest.mark.parametrize("name,kind", [(name, kind) for name, _, kind in BOUND])
def test_every_field_round_trips_through_keyword_property_and_repr(name: str, kind: str):
    sample = SAMPLES[kind]
    assert getattr(ferry.SyncOptions(), name) != sample
    opts = ferry.SyncOptions(**{name: sample})
    assert getattr(opts, name) == sample
    assert f"{name}={sample!r}" in repr(opts)
    again = eval(repr(opts), {"SyncOptions": ferry.SyncOptions})  # the repr is a constructor call
    assert {n: getattr(again, n) for n, _, _ in BOUND} == {n: getattr(opts, n) for n, _, _ in BOUND}
    fresh = ferry.SyncOptions()
    setattr(fresh, name, sample)
    assert getattr(fresh, name) == sample


def test_the_constructor_names_every_field_with_its_default():
    signature = inspect.getdoc(ferry.SyncOptions.__init__).splitlines()[0]
    defaults = ferry.SyncOptions()
    for name, _, _ in BOUND:
        assert f"{name}: " in signature and f"= {getattr(defaults, name)!r}" in signature, name


def test_an_unknown_keyword_is_refused_naming_it():
    with pytest.raises(TypeError, match="bogus_option"):
        ferry.SyncOptions(bogus_option=1)
    with pytest.raises(TypeError):
        ferry.SyncOptions(512 << 20)  # keywords only


def test_bad_values_name_the_option():
    with pytest.raises(ferry.InvalidArgumentError, match=r"SyncOptions\.wire_protect: .*'hmac'"):
        ferry.SyncOptions(wire_protect="hmac")
    with pytest.raises(ferry.InvalidArgumentError, match=r"SyncOptions\.delta: delta mode 'yes'"):
        ferry.SyncOptions(delta="yes")
    with pytest.raises(ferry.InvalidArgumentError, match=r"SyncOptions\.timeout: nan"):
        ferry.SyncOptions().timeout = math.nan
    with pytest.raises(TypeError, match="slots=-1"):  # pybind11 names the keyword and value
        ferry.SyncOptions(slots=-1)


def test_times_are_seconds_and_negative_waits_forever():
    assert ferry.SyncOptions(timeout=0.25).timeout == 0.25
    assert ferry.SyncOptions(idle_timeout=-5).idle_timeout == -1.0
    assert ferry.SyncOptions(idle_timeout=math.inf).idle_timeout == -1.0
    assert ferry.SyncOptions().idle_timeout == -1.0


def test_options_python_could_not_set_before():
    opts = ferry.SyncOptions(max_ring_bytes=1 << 20, delta_snapshot_limit=4096, delta_threads=2)
    assert (opts.max_ring_bytes, opts.delta_snapshot_limit, opts.delta_threads) == (
        1 << 20, 4096, 2)
    assert ferry.SyncOptions().delta_snapshot_limit == 2**64 - 1  # no bound


def test_endpoints_take_their_roles_fields_as_keywords():
    assert sync.SYNC_OPTIONS == tuple(name for name, _, _ in BOUND)
    defaults = ferry.SyncOptions()
    for cls, roles in ((ferry.Sender, ("session", "sender")),
                       (ferry.Receiver, ("session", "receiver")),
                       (ferry.Relay, ("session", "receiver"))):
        params = inspect.signature(cls).parameters
        for name, role, _ in BOUND:
            if role in roles:
                assert params[name].default == getattr(defaults, name), (cls, name)
                assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
            else:
                assert name not in params, (cls, name)


def test_endpoints_refuse_another_roles_field_naming_it():
    address = unique_address()
    with pytest.raises(TypeError, match="'bucket_bytes' .*a sender option"):
        ferry.Receiver(address, 0, bucket_bytes=4096)
    with pytest.raises(TypeError, match="'max_ring_bytes' .*a receiver option"):
        ferry.Sender(address, max_ring_bytes=4096)
    with pytest.raises(TypeError, match="'bogus_option' .*no SyncOptions field"):
        ferry.Relay("127.0.0.1:1", 0, address, bogus_option=1)
    with pytest.raises(TypeError, match="not both"):
        ferry.Sender(address, options=ferry.SyncOptions(), slots=3)


def test_keywords_reach_the_session():
    """A receiver's max_assembled_tensor_bytes, given as a keyword, refuses a round whose
    tensor spans buckets past it."""
    address = unique_address()
    sender = ferry.Sender(address, bucket_bytes=4096, timeout=20, checksums=False)
    out = {}

    def receive():
        try:
            with ferry.Receiver(address, 0, timeout=20, max_assembled_tensor_bytes=4096) as rx:
                rx.receive_round(lambda name, tensor: None)
        except ferry.FerryError as e:
            out["error"] = e

    thread = threading.Thread(target=receive)
    thread.start()
    try:
        sender.accept(1)
        with pytest.raises(ferry.FerryError):
            sender.send_round({"big": torch.zeros(2048)})  # 8192 bytes, two buckets
    finally:
        thread.join(30)
        sender.close()
    assert isinstance(out.get("error"), ferry.ResourceExhaustedError), out
    assert "max_assembled_tensor_bytes" in str(out["error"])

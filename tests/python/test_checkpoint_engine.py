"""ferry.verl.checkpoint_engine under a harness that replays verl's CheckpointEngineManager
(issue #17 items 1-2): every rank is its own process; per update the harness runs prepare on
every rank -> build_topology -> init_process_group -> actor send_weights beside rollout
receive_weights -> finalize, as verl's manager does through Ray.

A replay, not verl's own manager: tests/verl_stack/ runs the backend under verl's real
CheckpointEngineManager, worker classes and Ray; this harness stays for what Ray makes slow or
cannot do here (a rank per process started in a second, node-id overrides and network
namespaces for several nodes, hundreds of ms bounds on failures)."""

from __future__ import annotations

import asyncio
import os
import time
import warnings

import pytest
import torch

import ferry
from conftest import digest, new_process, processes

BUCKET = 1 << 20
KILL_BOUND_S = 30.0  # a dead rank is seen at once (socket EOF); the product waits 600 s


def _weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """A few dozen tensors of mixed dtypes, one (3 MiB) larger than the bucket."""
    g = torch.Generator().manual_seed(step)
    out = [("model.embed_tokens.weight",
            torch.randn(1536, 1024, generator=g).to(torch.bfloat16))]
    for i in range(8):
        out.append((f"model.layers.{i}.q_proj.weight",
                    torch.randn(64, 96, generator=g).to(torch.bfloat16)))
        out.append((f"model.layers.{i}.norm.weight", torch.randn(96, generator=g)))
        out.append((f"model.layers.{i}.bias", torch.randn(33, generator=g).half()))
        out.append((f"model.layers.{i}.index", torch.randint(-9, 9, (17,), generator=g)))
    out.append(("model.mask", torch.randint(0, 2, (40,), generator=g).to(torch.bool)))
    out.append(("model.codes", torch.randint(-128, 127, (300,), generator=g).to(torch.int8)))
    return out


def _bucket_weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """Ten 384 KiB tensors, distinct per step: five or so 1 MiB buckets, so each of the
    rollout rank's two receive buffers is refilled more than once per update."""
    g = torch.Generator().manual_seed(1000 + step)
    return [(f"model.layers.{i}.mlp.weight", torch.randn(96 * 1024, generator=g))
            for i in range(10)]


def _reused_buffer_weights(step: int):
    """_weights(step) as views of one buffer refilled for every tensor, as verl's nixl
    engine with device=cpu yields them: right only if each is taken before the next."""
    buffer = torch.empty(4 << 20, dtype=torch.uint8)
    for name, tensor in _weights(step):
        view = buffer[:tensor.numel() * tensor.element_size()].view(tensor.dtype)
        view = view.view(tensor.shape)
        view.copy_(tensor)
        yield name, view
        buffer.fill_(0xee)


def _reshaped_weights(step: int) -> list[tuple[str, torch.Tensor]]:
    """_weights with model.layers.3.q_proj.weight transposed: another shape, same bytes."""
    return [(n, t.t().contiguous() if n == "model.layers.3.q_proj.weight" else t)
            for n, t in _weights(step)]


def _missing_weights(step: int) -> list[tuple[str, torch.Tensor]]:
    return _weights(step)[:-1]


def _extra_weights(step: int) -> list[tuple[str, torch.Tensor]]:
    return _weights(step) + [("model.extra", torch.arange(7, dtype=torch.float32) * step)]


def _dying_weights(step: int):
    """_weights(step), but the process dies (a killed trainer rank) after 12 tensors."""
    for i, item in enumerate(_weights(step)):
        if i == 12:
            os._exit(4)
        yield item


WEIGHTS = {"mixed": _weights, "buckets": _bucket_weights, "reused": _reused_buffer_weights,
           "reshaped": _reshaped_weights, "missing": _missing_weights, "extra": _extra_weights,
           "dying": _dying_weights}


def _expected(step: int, weights: str = "mixed") -> dict[str, str]:
    return {name: digest(t) for name, t in WEIGHTS[weights](step)}


async def _receive(engine, step: int, die_after: int | None, weights: str = "mixed",
                   raise_after: int | None = None) -> dict[str, str]:
    """As verl's CheckpointEngineWorker.update_weights: takes the iterator, then hands it to
    its server adapter, which here loads every tensor, or dies or raises after some."""
    sums = {}
    received = engine.receive_weights(global_steps=step)
    if raise_after == 0:  # verl's vLLM adapter checks the wire format before it iterates
        raise AssertionError("vLLM rollout only consumes full named tensors")
    async for name, tensor in received:
        sums[name] = digest(tensor)
        tensor.zero_()  # verl's loaders may write into what they were given
        if die_after is not None and len(sums) == die_after:
            os._exit(3)  # killed mid-update
        if raise_after is not None and len(sums) == raise_after:
            raise ValueError(f"the loader has no parameter {name}")
    return sums


async def _receive_slowly(engine, step: int) -> dict:
    """A loader that holds each tensor until the next one arrived: checks its bytes only then
    (after a pause in which a receiver thread running ahead would refill its buffer), before
    asking for the one after. Returns the names whose bytes were wrong when checked, the
    addresses of the tensors yielded and whether the receive buffers (the fallback copy)
    were used."""
    expected = _expected(step, "buckets")
    wrong, storages, held = [], set(), None
    async for name, tensor in engine.receive_weights(global_steps=step):
        storages.add(tensor.data_ptr())
        if held is not None:
            time.sleep(0.05)
            if digest(held[1]) != expected[held[0]]:
                wrong.append(held[0])
        held = (name, tensor)
    if held is not None and digest(held[1]) != expected[held[0]]:
        wrong.append(held[0])
    copied = any(b is not None for b in engine._receive_buffers._buffers)
    return {"wrong": wrong, "storages": storages, "names": len(expected), "copied": copied}


async def _cached(engine) -> dict[str, str]:
    return {name: digest(tensor) async for name, tensor in engine.get_weights()}


def _enter_netns(name: str) -> None:
    """Moves this process into network namespace `name` as `ip netns exec` does, as a rank
    on another node (tests/netns/verl_backend_netns.sh runs the harness so): setns, then a
    private /sys of that namespace, where UCX looks for the network devices it may use."""
    import ctypes
    clone_newnet, clone_newns, ms_rec, ms_slave, mnt_detach = (0x40000000, 0x20000, 0x4000,
                                                               1 << 19, 2)
    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"{what} (entering network namespace {name})")

    with open(f"/var/run/netns/{name}") as f:
        check(libc.setns(f.fileno(), clone_newnet), "setns")
    check(libc.unshare(clone_newns), "unshare")
    check(libc.mount(b"none", b"/", None, ms_rec | ms_slave, None), "mount --make-rslave /")
    check(libc.umount2(b"/sys", mnt_detach), "umount /sys")
    check(libc.mount(name.encode(), b"/sys", b"sysfs", 0, None), "mount sysfs")


def _rank_main(conn, is_master: bool, engine_kwargs: dict, netns: str | None = None) -> None:
    """One verl rank: runs the manager's calls it is sent, answers ("ok", result) or
    ("error", type, message)."""
    if netns:
        _enter_netns(netns)
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    engine = FerryCheckpointEngine(BUCKET, is_master=is_master, **engine_kwargs)
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "prepare":
                out = engine.prepare()
            elif cmd == "init":
                engine.init_process_group(**args[0])
                out = (engine.sessions_built, engine.session_ids)
            elif cmd == "send":
                weights = WEIGHTS[args[1] if len(args) > 1 else "mixed"](args[0])
                out = asyncio.run(engine.send_weights(weights, global_steps=args[0]))
            elif cmd == "receive":
                out = asyncio.run(_receive(engine, *args))
            elif cmd == "receive_slowly":
                out = asyncio.run(_receive_slowly(engine, *args))
            elif cmd == "cached":
                out = asyncio.run(_cached(engine))
            elif cmd == "finalize":
                out = engine.finalize()
            else:  # exit
                engine.close()
                conn.send(("ok", None))
                return
            conn.send(("ok", out))
        except Exception as e:
            conn.send(("error", type(e).__name__, str(e)))


class _Rank:
    def __init__(self, is_master: bool = False, netns: str | None = None,
                 **engine_kwargs) -> None:
        self.conn, child = processes().Pipe()
        self.proc = new_process(_rank_main, child, is_master, engine_kwargs, netns, daemon=True)
        self.proc.start()

    def call(self, *cmd) -> None:
        self.conn.send(cmd)

    def result(self, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.2):
            if time.monotonic() > deadline:
                pytest.fail(f"rank {self.proc.name}: no answer in {timeout} s")
        try:
            return self.conn.recv()
        except EOFError:  # the process died: its end of the pipe closed
            self.proc.join(10)
            return ("dead", self.proc.exitcode)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.call("exit")
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class _Manager:
    """verl's CheckpointEngineManager.update_weights, over processes instead of Ray."""

    def __init__(self, actors: list[_Rank], rollouts: list[_Rank]) -> None:
        self.actors, self.rollouts = actors, rollouts

    def _all(self, ranks, *cmds) -> list:
        for rank, cmd in zip(ranks, cmds):
            rank.call(*cmd)
        return [rank.result() for rank in ranks]

    def update(self, step: int, die: dict[int, int] | None = None,
               slow: bool = False, weights: str = "mixed",
               raises: dict[int, int] | None = None,
               actor_weights: dict[int, str] | None = None) -> dict:
        from ferry.verl.checkpoint_engine import FerryCheckpointEngine
        ranks = self.actors + self.rollouts
        metadata = self._all(ranks, *[("prepare",)] * len(ranks))
        assert all(m[0] == "ok" for m in metadata), metadata
        trainer_kw, rollout_kw = FerryCheckpointEngine.build_topology(
            len(self.actors), len(self.rollouts), [m[1] for m in metadata])
        inits = self._all(ranks, *[("init", {k: v[i] for k, v in trainer_kw.items()})
                                   for i in range(len(self.actors))],
                          *[("init", {k: v[i] for k, v in rollout_kw.items()})
                            for i in range(len(self.rollouts))])
        assert all(r[0] == "ok" for r in inits), inits
        start = time.monotonic()
        die, raises = die or {}, raises or {}
        if slow:  # _bucket_weights, received by _receive_slowly
            moved = self._all(ranks, *[("send", step, "buckets")] * len(self.actors),
                              *[("receive_slowly", step)] * len(self.rollouts))
        else:
            actor_weights = actor_weights or {}
            moved = self._all(ranks, *[("send", step, actor_weights.get(i, weights))
                                       for i in range(len(self.actors))],
                              *[("receive", step, die.get(i), weights, raises.get(i))
                                for i in range(len(self.rollouts))])
        seconds = time.monotonic() - start
        live = [r for r in ranks if r.proc.is_alive()]
        finals = self._all(live, *[("finalize",)] * len(live))
        assert all(r[0] == "ok" for r in finals), finals
        print(f"step {step}: sent {moved[:len(self.actors)]}, {seconds:.2f} s")
        return {"inits": [r[1] for r in inits], "sent": moved[:len(self.actors)],
                "received": moved[len(self.actors):], "seconds": seconds}

    def stop(self) -> None:
        for rank in self.actors + self.rollouts:
            rank.stop()


@pytest.fixture
def colocated():
    manager = _Manager([_Rank(is_master=True)], [_Rank(), _Rank()])
    yield manager
    manager.stop()


def _assert_bit_exact(result: dict, step: int, weights: str = "mixed",
                      ordered: bool = True) -> None:
    """Every rollout rank got every tensor of the step once, byte for byte; in the trainer's
    order unless several senders sent it (then each part comes in its sender's order)."""
    expected = _expected(step, weights)
    for status in result["received"]:
        assert status[0] == "ok", status
        if ordered:
            assert list(status[1]) == list(expected), "verl's order of tensors"
        else:
            assert sorted(status[1]) == sorted(expected), "every tensor once"
        bad = [n for n in expected if status[1][n] != expected[n]]
        assert not bad, f"step {step}: wrong bytes for {bad}"


def test_colocated_updates_are_bit_exact_reuse_one_session_and_refuse_stale_steps(colocated):
    sessions = None
    for step in (1, 2, 3):
        result = colocated.update(step)
        _assert_bit_exact(result, step)
        kind, metrics = result["sent"][0]
        assert kind == "ok", metrics
        assert metrics["ferry/bytes"] == sum(t.numel() * t.element_size()
                                             for _, t in _weights(step))
        assert metrics["ferry/seconds"] > 0 and metrics["ferry/gbps"] > 0
        # Built once, at the first update; later updates keep the ring and sockets.
        built = [b for b, _ in result["inits"]]
        assert built == [1, 1, 1], f"step {step}: sessions rebuilt {built}"
        ids = [s for _, s in result["inits"]]
        sessions = sessions or ids
        assert ids == sessions
    # The receivers refuse an update older than what they hold, naming it.
    # At the round's BEGIN (the step travels there), before any tensor is delivered; the
    # sender fails with the receivers' reason.
    result = colocated.update(2)
    assert result["sent"][0][:2] == ("error", "FailedPreconditionError"), result["sent"]
    assert "stale weights" in result["sent"][0][2]
    for status in result["received"]:
        assert status[:2] == ("error", "FailedPreconditionError"), status
        assert "sends step 2, but this receiver has or requires step 3" in status[2], status
    # The refusal failed the update, so every rank rebuilt its sessions: a rank remembers the
    # last step it received across sessions and refuses the older one again.
    result = colocated.update(2)
    assert [b for b, _ in result["inits"]] == [2, 2, 2], result["inits"]
    assert result["sent"][0][:2] == ("error", "FailedPreconditionError"), result["sent"]
    for status in result["received"]:
        assert "sends step 2, but this receiver has or requires step 3" in status[2], status
    _assert_bit_exact(colocated.update(4), 4)  # the next newer update goes through


@pytest.mark.parametrize("raise_after", [0, 3], ids=["before-iterating", "after-3-tensors"])
def test_a_consumer_that_raises_fails_the_trainer_at_once_and_every_rank_recovers(
        colocated, raise_after):
    """verl's rollout worker hands receive_weights' iterator to its server adapter; when the
    adapter raises (before iterating, or part way), the trainer's send_weights fails at once,
    naming the rank, its pid and the adapter's exception, not at timeout_s; the next update
    rebuilds the sessions on every rank and is bit-exact everywhere."""
    _assert_bit_exact(colocated.update(1), 1)
    result = colocated.update(2, raises={1: raise_after})
    assert result["seconds"] < 5.0, result
    sent = result["sent"][0]
    assert sent[:2] == ("error", "AbortedError"), sent
    pid = colocated.rollouts[1].proc.pid
    assert f"rollout rank 1 (pid {pid})" in sent[2], sent
    cause = ("AssertionError: vLLM rollout only consumes" if raise_after == 0
             else "ValueError: the loader has no parameter")
    assert cause in sent[2], sent
    raised = "ValueError" if raise_after else "AssertionError"
    assert result["received"][1][:2] == ("error", raised), result
    again = colocated.update(3)
    _assert_bit_exact(again, 3)
    assert [b for b, _ in again["inits"]] == [2, 2, 2], "every rank rebuilt, none alone"
    _assert_bit_exact(colocated.update(4), 4)


def test_colocated_rank_killed_mid_update_fails_both_sides_then_recovers(colocated):
    _assert_bit_exact(colocated.update(1), 1)
    result = colocated.update(2, die={1: 3})
    assert result["seconds"] < KILL_BOUND_S, result
    assert result["sent"][0][0] == "error", result["sent"]
    assert result["received"][1] == ("dead", 3)
    sent = result["sent"][0]
    assert sent[1].endswith("Error") and sent[2], sent  # a named error
    # The other rollout rank either had its whole update (it acknowledged before the peer
    # died) or got a named error: never part of an update without one.
    survivor = result["received"][0]
    if survivor[0] == "ok":
        assert survivor[1] == _expected(2)
    else:
        assert survivor[1].endswith("Error") and survivor[2], survivor
    colocated.rollouts[1] = _Rank()  # the rank comes back (a new process)
    result = colocated.update(3)
    _assert_bit_exact(result, 3)
    assert result["inits"][0][0] == 2, "membership changed: the master served anew"


def _token(path) -> str:
    path.write_text(os.urandom(32).hex())  # as `ferry token new` makes: 256 random bits
    path.chmod(0o600)
    return str(path)


def test_disaggregated_one_relay_per_node_over_loopback(tmp_path):
    """The master's node (a) and two remote nodes (b, c) of two rollout ranks each: the master
    sends each byte once per remote node; each node's first rank hosts the relay."""
    net = {"token_file": _token(tmp_path / "token"), "interface": "127.0.0.1"}
    nodes = ["node-a", "node-b", "node-b", "node-c", "node-c"]
    manager = _Manager([_Rank(is_master=True, node_id="node-a", **net),
                        _Rank(node_id="node-a", **net)],
                       [_Rank(node_id=node, **net) for node in nodes])
    try:
        for step in (1, 2, 3):
            result = manager.update(step)
            _assert_bit_exact(result, step)
            assert result["sent"][1] == ("ok", {}), "a non-master actor rank sends nothing"
            metrics = result["sent"][0][1]
            model = sum(t.numel() * t.element_size() for _, t in _weights(step))
            assert metrics["ferry/bytes"] == model
            assert metrics["ferry/net_bytes"] == 2 * model, "once per remote node, not per rank"
            assert metrics["ferry/shm_bytes"] == model
            assert {"ferry/shm_seconds", "ferry/net_seconds"} <= set(metrics)
            assert [b for b, _ in result["inits"]] == [1, 0, 1, 1, 1, 1, 1]
            hosts = [ids for _, ids in result["inits"][2:]]
            assert ["relay" in ids for ids in hosts] == [False, True, False, True, False]
        # node-b's relay host killed mid-update: the master names the lost relay (its net
        # receiver 0); once the rank is back, the next update reaches all.
        result = manager.update(4, die={1: 3})
        assert result["seconds"] < KILL_BOUND_S, result
        assert result["received"][1] == ("dead", 3)
        sent = result["sent"][0]
        print("master:", sent, "\nnode-b's other rank:", result["received"][2][:3])
        assert sent[:2] == ("error", "AbortedError") and "receiver 0" in sent[2], sent
        # node-b's other rank either had its whole update (it acknowledged to the relay before
        # the host died) or names the lost relay: never part of an update without an error.
        orphan = result["received"][2]
        if orphan[0] == "ok":
            assert orphan[1] == _expected(4)
        else:
            assert orphan[1].endswith("Error") and orphan[2], orphan
        manager.rollouts[1] = _Rank(node_id="node-b", **net)
        _assert_bit_exact(manager.update(5), 5)
    finally:
        manager.stop()


def _one_update(master, rank: _Rank, step: int) -> tuple:
    """The manager's sequence for a master engine in this process and one rollout rank."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    rank.call("prepare")
    meta = rank.result()
    assert meta[0] == "ok", meta
    trainer_kw, rollout_kw = FerryCheckpointEngine.build_topology(1, 1, [master.prepare(),
                                                                          meta[1]])
    rank.call("init", {k: v[0] for k, v in rollout_kw.items()})
    try:
        master.init_process_group(**{k: v[0] for k, v in trainer_kw.items()})
    except ferry.FerryError as e:
        return ("error", type(e).__name__, str(e)), rank.result()
    init = rank.result()
    assert init[0] == "ok", init
    rank.call("receive", step, None)
    metrics = asyncio.run(master.send_weights(_weights(step), global_steps=step))
    return ("ok", metrics), rank.result()


def test_engines_in_one_process_use_their_own_token_files(tmp_path, monkeypatch):
    """Two master engines in one process, each with its token file and a rollout rank on
    another node that has the same file: neither engine's token reaches the other's session
    (the file travels in SyncOptions, not in the process environment)."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    monkeypatch.delenv("FERRY_TOKEN", raising=False)
    monkeypatch.delenv("FERRY_TOKEN_FILE", raising=False)
    first, second = _token(tmp_path / "first"), _token(tmp_path / "second")
    net = {"interface": "127.0.0.1", "node_id": "node-a", "timeout_s": 20}
    masters = [FerryCheckpointEngine(BUCKET, is_master=True, token_file=first, **net),
               FerryCheckpointEngine(BUCKET, is_master=True, token_file=second, **net)]
    ranks = [_Rank(node_id="node-b", token_file=first), _Rank(node_id="node-c",
                                                              token_file=second)]
    try:
        assert "FERRY_TOKEN_FILE" not in os.environ
        for step in (1, 2):
            for master, rank in zip(masters, ranks):
                sent, received = _one_update(master, rank, step)
                assert sent[0] == "ok", sent
                assert received == ("ok", _expected(step))
    finally:
        for master in masters:
            master.close()
        for rank in ranks:
            rank.stop()


def test_wrong_token_file_is_named(tmp_path):
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    master = FerryCheckpointEngine(BUCKET, is_master=True, interface="127.0.0.1",
                                   node_id="node-a", timeout_s=5,
                                   token_file=_token(tmp_path / "right"))
    rank = _Rank(node_id="node-b", timeout_s=5, token_file=_token(tmp_path / "wrong"))
    try:
        sent, received = _one_update(master, rank, 1)
        # The rollout rank hosting the relay says why; the master saw no relay join in time.
        assert received[:2] == ("error", "UnauthenticatedError"), received
        assert "refused our token" in received[2], received
        assert sent[:2] == ("error", "TimeoutError") and "no receiver joined" in sent[2], sent
    finally:
        master.close()
        rank.stop()


def test_get_weights_yields_the_last_complete_update(colocated):
    colocated.rollouts[1].stop()
    colocated.rollouts[1] = _Rank(cache=True)
    colocated.rollouts[0].call("cached")
    result = colocated.rollouts[0].result()
    assert result[:2] == ("error", "FailedPreconditionError") and "cache" in result[2], result
    colocated.rollouts[1].call("cached")
    result = colocated.rollouts[1].result()
    assert result[:2] == ("error", "FailedPreconditionError") and "no update" in result[2]
    for step in (1, 2):
        _assert_bit_exact(colocated.update(step), step)
    # The caller zeroed every tensor it was given: the cache holds its own copy.
    for _ in range(2):  # and each get_weights() yields fresh copies
        colocated.rollouts[1].call("cached")
        assert colocated.rollouts[1].result() == ("ok", _expected(2))
    stale = colocated.update(1)  # refused: the cache keeps the last complete update
    assert stale["received"][1][:2] == ("error", "FailedPreconditionError"), stale
    colocated.rollouts[1].call("cached")
    assert colocated.rollouts[1].result() == ("ok", _expected(2))


def test_build_topology_gives_each_other_node_one_relay():
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    meta = [{"node": "a", "pid": 1, "is_master": False},
            {"node": "a", "pid": 2, "is_master": True, "shm": "@s", "net": "h:1"},
            {"node": "b", "pid": 3}, {"node": "a", "pid": 4}, {"node": "b", "pid": 5}]
    for i, m in enumerate(meta):
        m["relay"] = f"@relay-{i}"
    meta.append({"node": "c", "pid": 6, "relay": "@relay-5"})
    trainer, rollout = FerryCheckpointEngine.build_topology(2, 4, meta)
    assert trainer["role"] == ["idle", "master"]
    assert rollout["rank"] == [0, 1, 2, 3]
    assert rollout["kind"] == ["relay", "shm", "relay", "relay"]
    assert rollout["relay_id"] == [0, -1, 0, 1]
    assert rollout["receiver_id"] == [0, 0, 1, 0]
    assert rollout["hosts_relay"] == [True, False, False, True]
    plan = rollout["plan"][0]
    assert plan["shm_receivers"] == 1 and plan["net_receivers"] == 2, "one relay per node"
    assert plan["relays"] == [{"node": "b", "local": "@relay-2", "receivers": 2},
                              {"node": "c", "local": "@relay-5", "receivers": 1}]
    meta[1]["net"] = None  # the master's hostname did not resolve and no interface was set
    with pytest.raises(ferry.InvalidArgumentError, match="engine_kwargs.ferry.interface"):
        FerryCheckpointEngine.build_topology(2, 4, meta)


def _node_identity_in_child(new_netns: bool) -> str | None:
    """node_identity() of a forked child, in a network namespace of its own if asked (None
    where it cannot have one)."""
    import ctypes
    from ferry.verl.checkpoint_engine import node_identity
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only unshare, readlink, gethostname before _exit
        code = 1
        try:
            os.close(read)
            if new_netns and ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:
                code = 2  # CLONE_NEWNET refused (no CAP_SYS_ADMIN here)
            else:
                os.write(write, node_identity().encode())
                code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        identity = f.read().decode()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 2), f"child (new netns: {new_netns}) exited {code}"
    return identity if code == 0 else None


def test_node_identity_tells_network_namespaces_apart():
    """Under verl's config every rank gets the same engine_kwargs (no node_id per rank), so
    the default identity must tell apart ranks that cannot share an shm session: one in
    another network namespace of this machine cannot reach the master's abstract socket.
    Same namespace: one node (shm); another: another node (its own relay)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine, node_identity
    here = node_identity()
    assert _node_identity_in_child(new_netns=False) == here
    there = _node_identity_in_child(new_netns=True)
    if there is None:
        pytest.skip("cannot create a network namespace here")
    assert there != here
    assert there.rsplit("/", 1)[0] == here.rsplit("/", 1)[0], "same host, same machine-id"
    meta = [{"node": here, "pid": 1, "is_master": True, "shm": "@s", "net": "h:1"},
            {"node": here, "pid": 2}, {"node": there, "pid": 3}]
    for i, m in enumerate(meta):
        m["relay"] = f"@relay-{i}"
    _, rollout = FerryCheckpointEngine.build_topology(1, 2, meta)
    assert rollout["kind"] == ["shm", "relay"] and rollout["hosts_relay"] == [False, True]


def test_build_topology_keeps_an_epoch_only_when_every_rank_holds_it_healthy():
    """One decision for every rank: no rank keeps a session its peers rebuild."""
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine

    def meta(epoch=None, healthy=True, rollout_epochs=("i/3", "i/3"), members=None):
        master = {"node": "a", "pid": 1, "is_master": True, "shm": "@s", "net": None,
                  "relay": "@r0", "instance": "i", "epoch": epoch, "healthy": healthy,
                  "members": members}
        rollout = [{"node": "a", "pid": 2 + k, "relay": f"@r{k + 1}", "epoch": e,
                    "healthy": True} for k, e in enumerate(rollout_epochs)]
        return [master] + rollout

    def epoch(metadata):
        return FerryCheckpointEngine.build_topology(1, 2, metadata)[1]["plan"][0]["epoch"]

    members = [["a", 2], ["a", 3]]
    assert epoch(meta()) == "i/1", "a new master starts its first epoch"
    assert epoch(meta("i/3", members=members)) == "i/3", "all healthy: kept"
    assert epoch(meta("i/3", healthy=False, members=members)) == "i/4"
    assert epoch(meta("i/3", rollout_epochs=("i/3", None), members=members)) == "i/4"
    assert epoch(meta("i/3", rollout_epochs=("i/3", "i/2"), members=members)) == "i/4"
    assert epoch(meta("i/3", members=[["a", 2], ["a", 9]])) == "i/4", "a rank replaced"
    bad = meta("i/3", members=members)
    bad[2]["healthy"] = False  # its last receive failed
    assert epoch(bad) == "i/4"


def test_unknown_engine_kwargs_warn_once_by_name():
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FerryCheckpointEngine(BUCKET, tokn_file="x")
        FerryCheckpointEngine(BUCKET, tokn_file="x", slots=2)
    messages = [str(w.message) for w in caught]
    assert messages == ["ferry checkpoint engine: unknown engine_kwargs key 'tokn_file' is "
                        "ignored"]


def test_engine_kwargs_are_sync_options_fields_plus_the_engines_own_and_reach_the_sessions():
    """ENGINE_KWARGS is derived from ferry.sync.SYNC_OPTIONS: every field the engine does not
    set itself is accepted and reaches every session's SyncOptions as given."""
    import ferry.sync
    from ferry.verl import checkpoint_engine as ce
    passed = set(ferry.sync.SYNC_OPTIONS) - set(ce.ENGINE_SETS)
    assert ce.ENGINE_KWARGS == passed | ce.ENGINE_OWN_KWARGS
    assert {"wire_protect", "max_ring_bytes", "token_file", "slots", "checksums"} <= passed
    given = {"token_file": "/run/ferry/token", "wire_protect": "mac", "slots": 3,
             "checksums": False, "max_ring_bytes": 1 << 30,
             "max_assembled_tensor_bytes": 1 << 29}
    assert set(given) == passed, "a new SyncOptions field: give it a value here"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none is warned about
        engine = ce.FerryCheckpointEngine(BUCKET, **given, timeout_s=7.0)
    options = engine._options()
    for name, value in given.items():
        assert getattr(options, name) == value, name
    assert options.bucket_bytes == BUCKET and options.timeout == 7.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ce.FerryCheckpointEngine(BUCKET, bucket_bytes=1 << 20)
    assert [str(w.message) for w in caught] == [
        "ferry checkpoint engine: engine_kwargs key 'bucket_bytes' is ignored: the engine sets "
        "it (verl's bucket_size)"]


def test_registered_as_ferry_backend():
    import importlib
    module = importlib.import_module("ferry.verl.checkpoint_engine")  # custom_backend_module
    from ferry._verl_compat import CheckpointEngineRegistry
    assert CheckpointEngineRegistry.get("ferry") is module.FerryCheckpointEngine
    engine = CheckpointEngineRegistry.new("ferry", bucket_size=BUCKET, is_master=True)
    assert engine.wire_format == "named_tensors" and engine.prepare()["is_master"]


def test_non_master_actor_rank_iterates_its_generator_and_sends_nothing():
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine
    engine = FerryCheckpointEngine(BUCKET)
    engine.init_process_group(role="idle", plan={})
    taken = []

    def weights():  # FSDP's generator runs collectives that every trainer rank must join
        for name, tensor in _weights(1):
            taken.append(name)
            yield name, tensor

    assert asyncio.run(engine.send_weights(weights(), global_steps=1)) == {}
    assert taken == [name for name, _ in _weights(1)]


def test_small_rounds_send_what_does_not_fit_from_the_refilled_buffer_bit_exact():
    """round_bytes of 1 MiB: the staged first update goes as several rounds through one
    reused staging buffer; a tensor it has no room left for (the 3 MiB embedding, larger than
    all of it, among them) ends the round uncopied, sent from the generator's buffer before
    the generator refills it for the next tensor."""
    manager = _Manager([_Rank(is_master=True, round_bytes=1 << 20)], [_Rank()])
    try:
        for step in (1, 2):
            _assert_bit_exact(manager.update(step, weights="reused"), step, "reused")
    finally:
        manager.stop()


def test_yielded_views_stay_valid_until_the_caller_moved_past_the_next_bucket_start(colocated):
    """A ring slot is refilled only once the caller is done with its bucket: a slow loader
    checking each tensor after the next one arrived sees the bytes sent, and every update
    yields views of the ring itself (no receive-buffer copy) at the same addresses (tensors
    split across buckets in buffers the receiver reuses: no fresh memory per update)."""
    addresses = [[], []]
    for step in (1, 2, 3):
        result = colocated.update(step, slow=True)
        for rank, status in enumerate(result["received"]):
            assert status[0] == "ok", status
            assert not status[1]["wrong"], f"step {step}: overwritten before use: {status[1]}"
            assert not status[1]["copied"], "the ring's views were copied into receive buffers"
            addresses[rank].append(status[1]["storages"])
    for per_update in addresses:
        assert all(a == per_update[0] for a in per_update), "fresh memory in a later update"


def test_a_ring_of_one_slot_falls_back_to_copies_in_the_receive_buffers():
    """With one ring slot the rollout rank cannot keep a bucket's slot while the master fills
    the next, so it copies each bucket into its two receive buffers: still bit-exact (the
    loader writes into what it gets), still valid until the caller moved on."""
    manager = _Manager([_Rank(is_master=True, slots=1)], [_Rank()])
    try:
        for step in (1, 2):
            _assert_bit_exact(manager.update(step, weights="buckets"), step, "buckets")
        status = manager.update(3, slow=True)["received"][0]
        assert status[0] == "ok", status
        assert not status[1]["wrong"], f"overwritten before use: {status[1]}"
        assert status[1]["copied"], "a one-slot ring gave writable ring views"
    finally:
        manager.stop()


def _sent_metrics(result: dict) -> dict:
    kind, metrics = result["sent"][0]
    assert kind == "ok", result["sent"]
    return metrics


def test_later_updates_stream_into_the_ring_bit_exact_from_a_reused_buffer(colocated):
    """The first update teaches the manifest (staging); later ones pull each yielded tensor
    straight into the ring, before the generator refills its one buffer for the next."""
    for step in (1, 2, 3):
        result = colocated.update(step, weights="reused")
        _assert_bit_exact(result, step, "reused")
        metrics = _sent_metrics(result)
        assert metrics["ferry/streamed"] == (1.0 if step > 1 else 0.0), (step, metrics)
        assert metrics["ferry/bytes"] == sum(t.numel() * t.element_size()
                                             for _, t in _weights(step))
        assert metrics["ferry/shm_bytes"] == 2 * metrics["ferry/bytes"]  # two rollout ranks
        assert metrics["ferry/tensors"] == len(_weights(step))


@pytest.mark.parametrize("weights, named", [
    ("reshaped", "'model.layers.3.q_proj.weight' BF16[96, 64], but the manifest has "
                 "'model.layers.3.q_proj.weight' BF16[64, 96]"),
    ("missing", "the tensors ended before tensor 34 'model.codes' (the manifest has 35)"),
    ("extra", "tensor 35 'model.extra' is one more than the 35 of the manifest"),
])
def test_an_update_differing_from_the_manifest_fails_naming_the_tensor_then_relearns(
        colocated, weights, named):
    _assert_bit_exact(colocated.update(1), 1)
    result = colocated.update(2, weights=weights)  # streamed against update 1's manifest
    assert result["sent"][0][:2] == ("error", "InvalidArgumentError"), result["sent"]
    assert named in result["sent"][0][2]
    for status in result["received"]:  # the round was aborted: no rank has the update
        assert status[0] == "error" and status[1].endswith("Error"), status
    for step, streamed in ((3, 0.0), (4, 1.0)):  # relearned through staging, then streamed
        result = colocated.update(step, weights=weights)
        _assert_bit_exact(result, step, weights)
        assert _sent_metrics(result)["ferry/streamed"] == streamed, step


# -- several senders (engine_kwargs.ferry.senders) ------------------------------------------

def _model_bytes(step: int, weights: str = "mixed") -> int:
    return sum(t.numel() * t.element_size() for _, t in WEIGHTS[weights](step))


def _assert_parts(result: dict, step: int, weights: str, senders: int) -> list[int]:
    """Every sender returned the whole update's ferry/bytes and its own part's; the parts
    add up to the model. Returns each sender's bytes."""
    model = _model_bytes(step, weights)
    sent = [r[1] for r in result["sent"][:senders]]
    assert all(r[0] == "ok" for r in result["sent"]), result["sent"]
    parts = [metrics[f"ferry/sender{k}/bytes"] for k, metrics in enumerate(sent)]
    assert sum(parts) == model, (parts, model)
    for metrics in sent:
        assert metrics["ferry/bytes"] == model and metrics["ferry/senders"] == senders
    return parts


def test_two_senders_each_send_half_of_every_update_bit_exact():
    """senders=2, two actor ranks and two rollout ranks on one node: both actor ranks send,
    each a disjoint part of about half the bytes; every rollout rank gets every tensor once,
    byte for byte; the first update is staged and the later ones streamed on both senders;
    the sessions persist; a stale step is refused by every rank."""
    manager = _Manager([_Rank(is_master=True, senders=2), _Rank(senders=2)], [_Rank(), _Rank()])
    try:
        sessions = None
        for step in (1, 2, 3):
            result = manager.update(step, weights="buckets")
            _assert_bit_exact(result, step, "buckets", ordered=False)
            parts = _assert_parts(result, step, "buckets", 2)
            print(f"step {step}: per-sender bytes {parts}, {result['seconds']:.3f} s")
            assert parts[0] == parts[1], "ten equal tensors: five each"
            for k in range(2):
                metrics = result["sent"][k][1]
                # Each sender writes its part once per rollout rank of its shm session.
                assert metrics[f"ferry/sender{k}/shm_bytes"] == 2 * parts[k]
                assert metrics["ferry/streamed"] == (0.0 if step == 1 else 1.0), metrics
            built = [b for b, _ in result["inits"]]
            assert built == [1, 1, 1, 1], f"step {step}: sessions rebuilt {built}"
            sessions = sessions or result["inits"]
            assert result["inits"] == sessions
        for step in (4, 5):  # unequal tensors: the embedding alone is most of the model
            result = manager.update(step)
            _assert_bit_exact(result, step, ordered=False)
            parts = _assert_parts(result, step, "mixed", 2)
            print(f"step {step} (mixed): per-sender bytes {parts}")
            assert min(parts) > 0
        result = manager.update(3)
        for status in result["sent"]:
            assert status[:2] == ("error", "FailedPreconditionError"), result["sent"]
        for status in result["received"]:
            assert status[:2] == ("error", "FailedPreconditionError"), status
            assert "this receiver has or requires step 5" in status[2], status
        _assert_bit_exact(manager.update(6), 6, ordered=False)
    finally:
        manager.stop()


def test_a_sender_that_dies_is_named_and_the_next_update_works():
    """senders=2: actor rank 1 dies part way through an update (killed in its generator).
    Every rollout rank's update fails naming that rank and its pid; the master's fails too;
    with the rank back (a new process) the next update rebuilds every session and is exact."""
    manager = _Manager([_Rank(is_master=True, senders=2), _Rank(senders=2)], [_Rank(), _Rank()])
    try:
        _assert_bit_exact(manager.update(1), 1, ordered=False)
        pid = manager.actors[1].proc.pid
        result = manager.update(2, actor_weights={1: "dying"})
        assert result["seconds"] < KILL_BOUND_S, result
        assert result["sent"][1] == ("dead", 4)
        print("master:", result["sent"][0], "\nrollout:", result["received"])
        # The master's part arrived first, but its update fails too, naming the dead rank:
        # no sender's last round is acknowledged until every sender's last round ended.
        assert result["sent"][0][:2] == ("error", "AbortedError"), result["sent"]
        assert f"sender 1 is trainer rank 1 (pid {pid} " in result["sent"][0][2], result["sent"]
        for status in result["received"]:
            assert status[0] == "error", status
            assert f"sender 1 is trainer rank 1 (pid {pid} " in status[2], status
        manager.actors[1] = _Rank(senders=2)
        result = manager.update(3)
        _assert_bit_exact(result, 3, ordered=False)
        assert [b for b, _ in result["inits"]] == [2, 1, 2, 2]
        _assert_parts(result, 3, "mixed", 2)
    finally:
        manager.stop()


def test_two_senders_on_two_nodes_reach_every_node_through_one_relay_per_sender(tmp_path):
    """senders=2 with the senders on nodes a and b and rollout ranks on a, b (two) and c:
    each sender serves one net session, and every node has one relay per sender (hosted by
    its first rollout rank). Each sender's link carries its part once per node."""
    net = {"token_file": _token(tmp_path / "token"), "interface": "127.0.0.1", "senders": 2,
           "timeout_s": 15}
    manager = _Manager([_Rank(is_master=True, node_id="node-a", **net),
                        _Rank(node_id="node-b", **net)],
                       [_Rank(node_id=node, **net)
                        for node in ["node-a", "node-b", "node-b", "node-c"]])
    try:
        for step in (1, 2):
            result = manager.update(step, weights="buckets")
            _assert_bit_exact(result, step, "buckets", ordered=False)
            parts = _assert_parts(result, step, "buckets", 2)
            for k in range(2):
                metrics = result["sent"][k][1]
                assert metrics[f"ferry/sender{k}/net_bytes"] == 3 * parts[k], metrics
                assert f"ferry/sender{k}/shm_bytes" not in metrics
            hosts = [ids for _, ids in result["inits"][2:]]
            print(f"step {step}: per-sender bytes {parts}, sessions {hosts}")
    finally:
        manager.stop()


def test_build_topology_with_two_senders_and_the_senders_setting():
    from ferry.verl.checkpoint_engine import FerryCheckpointEngine

    def meta(node, pid, master=False, senders=2):
        m = {"node": node, "pid": pid, "host": node, "is_master": master, "epoch": None,
             "healthy": False, "relay": f"@relay-{pid}", "senders": senders,
             "sender_shm": f"@shm-{pid}", "sender_net": f"10.0.0.{pid}:5000"}
        if master:
            m.update(shm=f"@shm-{pid}", net=f"10.0.0.{pid}:5000", instance="i", members=None)
        return m

    trainer = [meta("a", 1, master=True), meta("b", 2), meta("b", 3)]
    rollout = [meta("a", 11), meta("b", 12), meta("c", 13), meta("c", 14)]
    t, r = FerryCheckpointEngine.build_topology(3, 4, trainer + rollout)
    assert t["role"] == ["master", "sender", "idle"] and t["sender"] == [0, 1, -1]
    # Rollout ranks on three nodes: each sender serves a net session, every node has a relay
    # of each, hosted by its first rank.
    assert r["addresses"] == [["@relay-11-s0", "@relay-11-s1"], ["@relay-12-s0", "@relay-12-s1"],
                              ["@relay-13-s0", "@relay-13-s1"], ["@relay-13-s0", "@relay-13-s1"]]
    assert r["receiver_id"] == [0, 0, 0, 1]
    assert [[(h["upstream"], h["relay_id"], h["receivers"]) for h in hosted]
            for hosted in r["part_relays"]] == [
        [("10.0.0.1:5000", 0, 1), ("10.0.0.2:5000", 0, 1)],
        [("10.0.0.1:5000", 1, 1), ("10.0.0.2:5000", 1, 1)],
        [("10.0.0.1:5000", 2, 2), ("10.0.0.2:5000", 2, 2)], []]
    # Every rollout rank on the senders' node: each sender's shm session, no relay.
    one_node = [meta("a", 1, master=True), meta("a", 2)] + [meta("a", 11), meta("a", 12)]
    _, r = FerryCheckpointEngine.build_topology(2, 2, one_node)
    assert r["addresses"] == [["@shm-1", "@shm-2"]] * 2 and r["part_relays"] == [[], []]
    assert r["receiver_id"] == [0, 1]
    trainer[0]["senders"] = "all"
    t, _ = FerryCheckpointEngine.build_topology(3, 4, trainer + rollout)
    assert t["role"] == ["master", "sender", "sender"]
    trainer[0]["senders"] = 4
    with pytest.raises(ferry.InvalidArgumentError, match="senders=4, but the trainer has 3"):
        FerryCheckpointEngine.build_topology(3, 4, trainer + rollout)
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(ferry.InvalidArgumentError, match="engine_kwargs.ferry.senders"):
            FerryCheckpointEngine(BUCKET, senders=bad)

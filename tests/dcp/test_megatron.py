"""Megatron-core's dist_checkpointing (torch_dist, megatron-core 0.16.1) on two nodes without
shared storage, on CPU over gloo: megatron's own path, ferry.dcp.megatron, and verl 0.9.1's
functions after `import ferry.verl.checkpoint`. Ranks are processes (dcp_job.py running
megatron_worker.py); the save is 4 ranks, node0 = ranks 0-1, node1 = ranks 2-3, each node's
ranks in their own folder. The state: 40 decoder-layer tensors of qwen2.5-0.5b sharded by rows
over the ranks, a replicated one and a common entry.

Each start of a rank costs seconds of imports (torch, megatron, verl) on a 2-core machine, so
one 4-rank job runs every save (megatron_worker.py's phases) and the tests read its report;
two 2-rank jobs load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

import dcp_job
import ferry.dcp
from ferry.dcp import __main__ as dcp_cli

pytest.importorskip("megatron.core")

SAVE_LAYOUT = ["node0", "node0", "node1", "node1"]
CHECKED = 41  # megatron_worker.TENSORS sharded tensors and the replicated one
MEGATRON_FILES = ["metadata.json", ".metadata", "common.pt"]  # rank 0's node only, unless ferry


def run(mode, nodes, root):
    return dcp_job.run(mode, nodes, root, worker="megatron_worker.py", timeout=240)


def folder(root, node, name="step_1"):
    return os.path.join(root, node, name)


def read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(root, each phase's reports, one per rank) of the 4-rank save job."""
    root = str(tmp_path_factory.mktemp("megatron"))
    job = run("save", SAVE_LAYOUT, root)
    assert job.returncodes == [0] * 4, job.output
    return root, {name: [r["phases"][name] for r in job.results]
                  for name in job.results[0]["phases"]}


def phase_ok(saved, name):
    reports = saved[1][name]
    assert all(r["ok"] for r in reports), reports
    return reports


def test_megatron_own_save_fails_on_cpu_and_its_layout_fails_to_load_on_node1(saved):
    """The FAQ failure. Megatron's own save cannot run on CPU: its writer calls
    torch.cuda.synchronize() (filesystem_async.py preload_tensors), after rank 0 wrote
    common.pt. So the layout is reproduced with megatron's save path as far as it runs
    (serialization.save: common.pt and metadata.json by rank 0, its torch_dist strategy and
    planner) and DCP's FileSystemWriter, the base class of megatron's writer, for the shards:
    .metadata by the coordinator. Then megatron's own load, unmodified, on node1's ranks."""
    root, phases = saved
    for r in phases["own"]:
        assert r["error"] == "AssertionError: Torch not compiled with CUDA enabled", r
        assert "filesystem_async.py:preload_tensors" in r["where"], r
        assert r["where"][-2:] == ["__init__.py:synchronize", "__init__.py:_lazy_init"], r
    assert os.listdir(folder(root, "node0", "own")) == ["common.pt"]
    assert os.listdir(folder(root, "node1", "own")) == []

    phase_ok(saved, "stock")
    node0, node1 = (set(os.listdir(folder(root, n, "stock"))) for n in ("node0", "node1"))
    assert set(MEGATRON_FILES) <= node0 and {"__0_0.distcp", "__1_0.distcp"} <= node0
    assert node1 == {"__2_0.distcp", "__3_0.distcp"}  # no metadata at all

    job = run("stock-load", ["node1", "node1"], root)
    errors = job.errors()
    assert len(errors) == 2 and all(
        e == f"CheckpointingException: {folder(root, 'node1', 'stock')} is not a distributed "
        "checkpoint" for e in errors), job.output


def test_save_and_load_at_4_ranks_same_layout(saved):
    assert [r["checked"] for r in phase_ok(saved, "ferry")] == [CHECKED] * 4


def test_save_puts_megatron_metadata_on_every_node_with_identical_bytes(saved):
    from megatron.core.dist_checkpointing.core import CheckpointingConfig

    import ferry.dcp.megatron as fm

    root = saved[0]
    phase_ok(saved, "ferry")
    for name in MEGATRON_FILES + [".ferry-index.json", ".ferry-commit"]:
        copies = [read(os.path.join(folder(root, n), name)) for n in ("node0", "node1")]
        assert copies[0] == copies[1] and copies[0], name
    # metadata.json: what megatron's save_config writes; node1's copy is ferry's, node0's was
    # rewritten by megatron's rank 0 after the commit, and the index holds its XXH3.
    config = read(os.path.join(folder(root, "node1"), "metadata.json"))
    assert config == fm.config_bytes("torch_dist", 1) == json.dumps(
        asdict(CheckpointingConfig("torch_dist", 1))).encode()
    rewritten = os.stat(os.path.join(folder(root, "node0"), "metadata.json")).st_mtime_ns
    committed = os.stat(os.path.join(folder(root, "node0"), ".ferry-commit")).st_mtime_ns
    assert rewritten >= committed
    index = ferry.dcp.read_committed(folder(root, "node1"))
    assert set(MEGATRON_FILES) <= set(index.replicated)
    shards = [e for e in index.files.values() if e.rank >= 0]
    assert {e.rank for e in shards} == {0, 1, 2, 3}
    assert all(e.path.startswith(f"__{e.rank}_") and e.host == SAVE_LAYOUT[e.rank]
               for e in shards), shards


def test_verify_passes_on_both_nodes_and_catches_a_different_metadata_json(saved, capsys):
    root = saved[0]
    phase_ok(saved, "ferry")
    for node in ("node0", "node1"):
        assert dcp_cli.main(["verify", folder(root, node)]) == 0, capsys.readouterr().out
    path = os.path.join(folder(root, "node0"), "metadata.json")
    original = read(path)
    try:
        with open(path, "w") as f:  # the same config, other bytes
            json.dump(json.loads(original), f, indent=1)
        assert dcp_cli.main(["verify", folder(root, "node0")]) == 1
        assert "DAMAGED metadata.json" in capsys.readouterr().out
    finally:
        with open(path, "wb") as f:
            f.write(original)


def test_load_at_2_ranks_on_swapped_nodes_fetches_the_other_nodes_shards(saved):
    root = saved[0]
    phase_ok(saved, "ferry")
    for node in ("node0", "node1"):  # forget what the same-layout load fetched
        for e in ferry.dcp.read_committed(folder(root, node)).files.values():
            path = os.path.join(folder(root, node), e.path)
            if e.rank >= 0 and e.host != node and os.path.exists(path):
                os.unlink(path)
    # Rank 0 (rows of saved ranks 0-1, node0's) runs on node1, rank 1 on node0.
    job = run("load", ["node1", "node0"], root)
    assert job.returncodes == [0, 0], job.output
    # First the stock save's folder: megatron's files on node0, nothing on node1. Megatron's
    # load would fail on node1 only and leave node0 waiting in a collective; here both ranks
    # fail at once, each naming both nodes' reasons.
    for r in job.results:
        assert "failed on 2 of 2 ranks" in r["stock_error"], r
        assert "rank 0 on node1: NotCommittedError" in r["stock_error"], r
        assert "rank 1 on node0: NotCommittedError" in r["stock_error"], r
        assert "ferry.dcp did not write" in r["stock_error"], r
    assert [r["checked"] for r in job.results] == [CHECKED] * 2
    for node, other in (("node0", ["__2_0.distcp", "__3_0.distcp"]),
                        ("node1", ["__0_0.distcp", "__1_0.distcp"])):
        assert set(other) <= set(os.listdir(folder(root, node))), node
        assert dcp_cli.main(["verify", folder(root, node)]) == 0


def test_verl_functions_after_the_switch(saved):
    """verl 0.9.1's save_dist_checkpointing / load_dist_checkpointing, imported from verl's
    module after `import ferry.verl.checkpoint` (its manager and model merger imported before:
    their names are replaced too): async_save refused by name; save as verl's manager calls it
    (FullyParallelSaveStrategyWrapper over the data-parallel group, content_metadata); the
    content metadata read back as the manager does, on both nodes; a load where each rank
    takes the rows saved two ranks away, on the other node, bit-exact. On CPU the load runs
    without verl's FullyParallelLoadStrategyWrapper (it calls torch.cuda.synchronize())."""
    root = saved[0]
    for r in phase_ok(saved, "verl"):
        assert r["switched"], r
        assert "actor_rollout_ref.actor.checkpoint.async_save" in r["async_error"], r
        assert r["content_metadata"] == {"distrib_optim_sharding_type":
                                         "fully_sharded_model_space", "ferry": 1}, r
        assert r["checked"] == CHECKED
    for name in MEGATRON_FILES:
        assert read(os.path.join(folder(root, "node0", "verl"), name)) == read(
            os.path.join(folder(root, "node1", "verl"), name)), name
    for node, other in (("node0", "__2_0.distcp"), ("node1", "__0_0.distcp")):
        assert other in os.listdir(folder(root, node, "verl"))  # fetched for the load
        assert dcp_cli.main(["verify", folder(root, node, "verl")]) == 0


def test_verl_switch_by_environment():
    """The switch for Ray workers: verl imports each module VERL_USE_EXTERNAL_MODULES names
    when it is imported itself, so every process that imports verl is switched."""
    code = ("import verl.utils.checkpoint.megatron_checkpoint_manager as m\n"
            "assert m.save_dist_checkpointing.__module__ == 'ferry.verl.checkpoint'\n"
            "assert m.load_dist_checkpointing.__module__ == 'ferry.verl.checkpoint'\n")
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="ferry.verl.checkpoint")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

"""ferry.dcp with the real torch.distributed.checkpoint (torch 2.13, gloo, DTensor shards as
FSDP2 holds them), a model of real shapes (qwen2.5-0.5b: 290 tensors) and a sharded optimizer
state, on two nodes without shared storage: each node's ranks have their own folder, and
nothing is copied between them by hand. Ranks are processes (dcp_job.py); the cross-node fetch
runs over loopback here and across network namespaces in tests/netns/dcp_netns.sh.

Layouts: the save is 4 ranks, node0 = ranks 0-1, node1 = ranks 2-3. Shards go by rows, so a
load whose ranks sit on the other node than the rows they need must fetch them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import dcp_job
import ferry.dcp

SAVE_LAYOUT = ["node0", "node0", "node1", "node1"]
TENSORS = 290  # qwen2.5-0.5b's Hugging Face checkpoint
CHECKED = 2 * TENSORS  # the weights and their exp_avg


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dcp"))
    job = dcp_job.run("save", SAVE_LAYOUT, root, "--step", "1")
    assert job.returncodes == [0] * 4, job.output
    assert [r["tensors"] for r in job.results] == [TENSORS] * 4
    return root


def folder(root, node, step=1):
    return os.path.join(root, node, f"step_{step}")


def forget_fetched(root, step=1):
    """Removes what loads fetched, so each test starts from what the save left."""
    for node in ("node0", "node1"):
        index = ferry.dcp.read_committed(folder(root, node, step))
        mine = {e.path for e in index.files.values() if e.host == node or e.rank < 0}
        for name in os.listdir(folder(root, node, step)):
            if name.startswith("__") and name not in mine:
                os.unlink(os.path.join(folder(root, node, step), name))


def size(root, node, *names):
    """Bytes of the named files in node's folder; a name absent there counts 0."""
    paths = [os.path.join(folder(root, node), n) for n in names]
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def assert_loaded(job):
    assert job.returncodes == [0] * len(job.returncodes), job.output
    assert [r["checked"] for r in job.results] == [CHECKED] * len(job.returncodes)
    return [r["fetched_bytes"] for r in job.results]


def test_save_puts_metadata_and_index_on_every_node_and_shards_where_written(root):
    shards = {}
    for node in ("node0", "node1"):
        names = set(os.listdir(folder(root, node)))
        assert {".metadata", ".ferry-index.json", ".ferry-commit"} <= names
        shards[node] = sorted(n for n in names if n.endswith(".distcp"))
    # Each rank's shards where it ran; the one small whole item (the optimizer's step, stored
    # once by DCP) in a small file of its own (NodeLocalWriter.SMALL_ITEM_BYTES).
    large = {n: [s for s in shards[n] if s.endswith("_0.distcp")] for n in shards}
    assert large == {"node0": ["__0_0.distcp", "__1_0.distcp"],
                     "node1": ["__2_0.distcp", "__3_0.distcp"]}
    small = [(n, s) for n in shards for s in shards[n] if s.endswith("_1.distcp")]
    assert len(small) == 1 and size(root, *small[0]) < 4096, small
    meta = [open(os.path.join(folder(root, n), ".metadata"), "rb").read() for n in shards]
    assert meta[0] == meta[1]
    index = ferry.dcp.read_committed(folder(root, "node1"))
    assert index.world_size == 4
    assert {e.path: (e.rank, e.host) for e in index.files.values() if e.rank >= 0} == {
        f"__{r}_{k}.distcp": (r, f"node{r // 2}") for r in range(4) for k in range(2)
        if (k == 0 or (f"node{r // 2}", f"__{r}_1.distcp") in small)}


def test_faq_case_fails_with_dcp_own_filesystem_writer(tmp_path):
    """The FAQ's failure, reproduced with DCP's FileSystemWriter/Reader: the nodes without the
    coordinator have no .metadata (torch 2.13 words it "metadata is None; global metadata read
    failed: [Errno 2] No such file or directory: '.../.metadata'"), so every rank fails."""
    root = str(tmp_path)
    job = dcp_job.run("dcp-save", SAVE_LAYOUT, root, "--step", "1")
    assert job.returncodes == [0] * 4, job.output
    assert os.path.exists(os.path.join(folder(root, "node0"), ".metadata"))
    assert not os.path.exists(os.path.join(folder(root, "node1"), ".metadata"))
    job = dcp_job.run("dcp-load", SAVE_LAYOUT, root, "--step", "1")
    assert job.returncodes != [0] * 4
    errors = job.errors()
    missing = f"No such file or directory: '{folder(root, 'node1')}/.metadata'"
    assert len(errors) == 4 and all(missing in e for e in errors), errors


def test_load_same_layout_reads_locally_but_for_small_replicated_items(root):
    """DCP stores a replicated item (here the optimizer's step) in one rank's file, and every
    rank reads it: the other node fetches that rank's small-items file, nothing more."""
    forget_fetched(root)
    fetched = assert_loaded(dcp_job.run("load", SAVE_LAYOUT, root))
    assert fetched[1] == fetched[3] == 0  # only a node's lowest rank fetches
    assert sorted(fetched) == [0, 0, 0, sum(fetched)] and 0 < sum(fetched) < 4096, fetched


def test_load_at_2_ranks_on_the_other_nodes_fetches_half(root):
    forget_fetched(root)
    # Rank 0 (rows of saved ranks 0-1, on node0) runs on node1, and rank 1 on node0.
    fetched = assert_loaded(dcp_job.run("load", ["node1", "node0"], root))
    # Each node fetched the other's large files (and some small ones): half the checkpoint.
    assert size(root, "node0", "__0_0.distcp", "__1_0.distcp") <= fetched[0] <= size(
        root, "node0", "__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp")
    assert size(root, "node1", "__2_0.distcp", "__3_0.distcp") <= fetched[1] <= size(
        root, "node1", "__2_0.distcp", "__2_1.distcp", "__3_0.distcp", "__3_1.distcp")


def test_load_at_8_ranks_interleaved(root):
    forget_fetched(root)
    fetched = assert_loaded(dcp_job.run("load", ["node0", "node1"] * 4, root))
    assert fetched[0] > 0 and fetched[1] > 0 and not any(fetched[2:])


def test_peer_serving_wrong_bytes_is_refused_and_named(root):
    forget_fetched(root)
    shard = os.path.join(folder(root, "node1"), "__2_0.distcp")
    with open(shard, "r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0x01]))
    try:
        job = dcp_job.run("load", ["node0", "node0"], root, "--peers", "{}")
        # node0 needs node1's files and no rank of this load runs there: named, with a fix.
        errors = job.errors()
        assert errors and all("__2_0.distcp" in e and "node1" in e and "ferry.dcp serve" in e
                              for e in errors), errors
        job = dcp_job.run("load", ["node1", "node0"], root)
        errors = job.errors()
        assert errors and all("__2_0.distcp" in e and "node1" in e for e in errors), errors
        assert not os.path.exists(os.path.join(folder(root, "node0"), "__2_0.distcp"))
    finally:
        with open(shard, "r+b") as f:
            f.seek(4096)
            f.write(byte)


def test_node_not_in_the_load_is_served_or_named(root, tmp_path):
    forget_fetched(root)
    token = tmp_path / "token"
    token.write_text(ferry_token())
    token.chmod(0o600)
    env = dict(os.environ, FERRY_TOKEN_FILE=str(token))
    server = subprocess.Popen(
        [sys.executable, "-m", "ferry.dcp", "serve", folder(root, "node1"),
         "--listen", "127.0.0.1:0"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("serving "), line
        address = line.rsplit(" ", 1)[1].strip()
        job = dcp_job.run("load", ["node0", "node0"], root, "--peers",
                          json.dumps({"node1": address}), env={"FERRY_TOKEN_FILE": str(token)})
        assert sum(assert_loaded(job)) >= size(root, "node1", "__2_0.distcp", "__3_0.distcp")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    forget_fetched(root)
    # The server is gone: the load names it and the files it was to give.
    job = dcp_job.run("load", ["node0", "node0"], root, "--peers",
                      json.dumps({"node1": address}), "--timeout-s", "3",
                      env={"FERRY_TOKEN_FILE": str(token)})
    errors = job.errors()
    assert errors and all(address in e and "__2_0.distcp" in e and "__3_0.distcp" in e
                          for e in errors), errors


def ferry_token() -> str:
    import secrets
    return secrets.token_hex(32)


# The kill tests save 40 of the preset's tensors (real shapes; the embedding, a quarter of the
# bytes, left out): what they check is the commit protocol, not the size.
FEW = ("--tensors", "1:41")


@pytest.fixture(scope="module")
def few_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("dcp-few"))
    job = dcp_job.run("save", SAVE_LAYOUT, root, "--step", "1", *FEW)
    assert job.returncodes == [0] * 4, job.output
    return root


@pytest.mark.parametrize("phase,rank", [("shards_written", 2), ("metadata_written", 1),
                                        ("committed", 2)])
def test_save_killed_leaves_the_previous_checkpoint_and_is_refused(few_root, phase, rank):
    root = few_root
    job = dcp_job.run("save", SAVE_LAYOUT, root, "--step", "2", *FEW,
                      env={"FERRY_DCP_TEST_DIE": f"{phase}:{rank}"})
    assert job.returncodes[rank] == -signal.SIGKILL, job.output
    job = dcp_job.run("load", SAVE_LAYOUT, root, "--step", "2", *FEW)
    if phase == "committed" and job.returncodes == [0] * 4:
        # The killed rank committed its node, and the other node's commit came first: the
        # save was whole. It must then load bit-exact.
        assert [r["checked"] for r in job.results] == [80] * 4
    else:
        errors = job.errors()
        assert errors and all("no finished ferry.dcp save" in e for e in errors), errors
    job = dcp_job.run("load", SAVE_LAYOUT, root, "--step", "1", *FEW)
    assert job.returncodes == [0] * 4, job.output
    assert [r["checked"] for r in job.results] == [80] * 4
    for node in ("node0", "node1"):
        shutil.rmtree(folder(root, node, 2), ignore_errors=True)


def test_8_ranks_on_4_nodes_save_and_a_4_rank_load_on_the_other_nodes(tmp_path):
    """The cluster shape: 8 ranks on 4 nodes save; 4 ranks load, each on a node that holds none
    of its rows (rank r on node 3 - r), so every node fetches from another, bit-exact."""
    root = str(tmp_path)
    nodes = [f"node{n}" for n in range(4) for _ in range(2)]
    job = dcp_job.run("save", nodes, root, *FEW)
    assert job.returncodes == [0] * 8, job.output
    for n in range(4):
        names = set(os.listdir(folder(root, f"node{n}")))
        assert {".metadata", ".ferry-index.json", ".ferry-commit",
                f"__{2 * n}_0.distcp", f"__{2 * n + 1}_0.distcp"} <= names, names
    job = dcp_job.run("load", [f"node{3 - r}" for r in range(4)], root, *FEW)
    assert job.returncodes == [0] * 4, job.output
    assert [r["checked"] for r in job.results] == [80] * 4
    assert all(r["fetched_bytes"] > 0 for r in job.results), job.results

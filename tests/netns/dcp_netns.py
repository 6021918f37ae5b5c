"""Run by dcp_netns.sh, in namespace s of three_nodes.sh: ferry.dcp across network namespaces,
so that a load's fetch of the shard files a node lacks really crosses a network:

    ns s  10.77.0.1: this driver, which hosts each job's rendezvous store (as torchrun's agent
                      does: TORCHELASTIC_USE_AGENT_STORE, MASTER_ADDR=10.77.0.1)
    ns a  10.77.0.2: "node0", its ranks' folder WORK/ckpt/node0
    ns b  10.77.0.3: "node1", its ranks' folder WORK/ckpt/node1

Every rank is tests/dcp/dcp_worker.py (a model of qwen2.5-0.5b's real shapes, 40 of its
tensors, DTensors sharded by rows, and their exp_avg), one process under `ip netns exec`, gloo
bound to its namespace's veth (GLOO_SOCKET_IFNAME: the host name resolves to loopback here).
Neither FERRY_DCP_HOST nor serve_host is set: each node's file server binds the address
ferry.dcp finds on the route to MASTER_ADDR (_group.reachable_host), and ferry logs it
(FERRY_LOG_LEVEL=info: "net: listening on HOST:PORT").

Checks (prints "ok: ..." per check, exits 1 on the first failure, 0 when all passed):
1. A save at 4 ranks (node0: ranks 0-1, node1: ranks 2-3); then a load at 2 ranks each on the
   other node than its rows (rank 0 in node1's namespace, rank 1 in node0's): bit-exact, each
   node's leader fetched at least the other node's large shard files (fetched_bytes > 0), and
   each node's file server listened on its own namespace's address, neither loopback nor the
   wildcard, and was reached from the other namespace (the fetching side's log names it).
2. A load at 8 ranks, 4 per namespace, interleaved: bit-exact; only the two leaders (ranks
   0 and 1) fetched, and started a file server, each on its namespace's address.
3. node1 down: a load of 2 ranks both in node0's namespace, peers={"node1": "10.77.0.3:PORT"}
   where nothing listens: every rank fails, its error names that address and node1's shard
   files, and node0's folder gained none of them. (ferry retries a refused connection until
   the reader's timeout_s, 60 s by default, which dcp_worker.py does not change: most of this
   test's time.)

    ip netns exec NS_S python3 dcp_netns.py NS_A IFACE_A NS_B IFACE_B WORK_DIR
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

import ferry.dcp

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "dcp", "dcp_worker.py")
MASTER_IP = "10.77.0.1"  # three_nodes.sh: the bridge, in namespace s (this driver's)
NODE_IP = {"node0": "10.77.0.2", "node1": "10.77.0.3"}
TENSORS = ("--tensors", "1:41")  # 40 tensors of real shapes (dcp_worker.py)
CHECKED = 2 * 40  # the weights and their exp_avg
SAVE_LAYOUT = ["node0", "node0", "node1", "node1"]
JOB_TIMEOUT_S = 120  # the down check waits 60 s, plus the ranks' start under load
DEADLINE_S = float(os.environ.get("FERRY_DCP_NETNS_DEADLINE_S", 240))

phase = "start"


def say(message: str) -> None:
    print(message, flush=True)


def fail(message: str) -> None:
    say(f"FAIL: {message}")
    sys.exit(1)


def watchdog() -> None:
    def expire() -> None:
        say(f"FAIL: still running after {DEADLINE_S:.0f} s, in phase: {phase}")
        os._exit(1)
    timer = threading.Timer(DEADLINE_S, expire)
    timer.daemon = True
    timer.start()


class Job:
    def __init__(self, name: str, returncodes: list[int], results: list[dict], logs: list[str]):
        self.name, self.returncodes, self.results, self.logs = name, returncodes, results, logs

    def output(self) -> str:
        return "\n".join(f"--- rank {i} ({self.name})\n{text[-3000:]}"
                         for i, text in enumerate(self.logs))

    def errors(self) -> list[str]:
        return [r["error"] for r in self.results if not r["ok"]]


class Running:
    """A job's rank processes, until wait()."""

    def __init__(self, name, nodes, store, procs, logs, result_file):
        self.name, self.nodes, self.store, self.procs = name, nodes, store, procs
        self.logs, self.result_file = logs, result_file
        self.deadline = time.monotonic() + JOB_TIMEOUT_S

    def wait(self) -> Job:
        procs = self.procs
        while any(p.poll() is None for p in procs):
            if time.monotonic() > self.deadline:
                for p in procs:
                    p.kill()
                for p in procs:
                    p.wait()
                job = Job(self.name, [p.returncode for p in procs], [],
                          [read(f) for f in self.logs])
                fail(f"job {self.name} on {self.nodes} did not end within {JOB_TIMEOUT_S} s\n"
                     f"{job.output()}")
            time.sleep(0.1)
        self.store = None  # the rendezvous store closes with its last reference
        results = []
        if os.path.exists(self.result_file):
            with open(self.result_file) as f:
                results = sorted((json.loads(line) for line in f if line.strip()),
                                 key=lambda r: r["rank"])
        return Job(self.name, [p.returncode for p in procs], results,
                   [read(f) for f in self.logs])


class Cluster:
    def __init__(self, netns: dict[str, str], iface: dict[str, str], work: str):
        self.netns, self.iface, self.work = netns, iface, work
        self.root = os.path.join(work, "ckpt")
        self.logs = os.path.join(work, "logs")
        os.makedirs(self.root)
        os.makedirs(self.logs)
        self.jobs = 0

    def start(self, name: str, mode: str, nodes: list[str], *extra: str, root: str = "",
              env: dict | None = None) -> "Running":
        """len(nodes) ranks of dcp_worker.py, rank i in nodes[i]'s namespace; the rendezvous
        store lives here, in namespace s, for this job only."""
        self.jobs += 1
        store = dist.TCPStore(MASTER_IP, 0, world_size=len(nodes), is_master=True,
                              wait_for_workers=False, timeout=timedelta(seconds=JOB_TIMEOUT_S))
        result_file = os.path.join(self.work, f"result-{self.jobs}.jsonl")
        procs, logs = [], []
        for rank, node in enumerate(nodes):
            penv = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(nodes)),
                        LOCAL_RANK=str(nodes[:rank].count(node)), MASTER_ADDR=MASTER_IP,
                        MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True",
                        FERRY_DCP_NODE=node, GLOO_SOCKET_IFNAME=self.iface[node],
                        OMP_NUM_THREADS="1", FERRY_LOG_LEVEL="info", **(env or {}))
            penv.pop("FERRY_DCP_HOST", None)
            log = os.path.join(self.logs, f"{self.jobs}-{name}-rank{rank}.log")
            logs.append(log)
            cmd = ["ip", "netns", "exec", self.netns[node], sys.executable, WORKER, mode,
                   "--root", root or self.root, "--result", result_file, *TENSORS, *extra]
            with open(log, "w") as out:
                procs.append(subprocess.Popen(cmd, env=penv, stdout=out,
                                              stderr=subprocess.STDOUT))
        return Running(name, nodes, store, procs, logs, result_file)

    def run(self, *args, **kwargs) -> "Job":
        return self.start(*args, **kwargs).wait()

    def folder(self, node: str, root: str = "") -> str:
        return os.path.join(root or self.root, node, "step_1")

    def size(self, node: str, *names: str) -> int:
        return sum(os.path.getsize(os.path.join(self.folder(node), n)) for n in names)

    def forget_fetched(self) -> None:
        """Removes what loads fetched: each check starts from what the save left."""
        for node in NODE_IP:
            index = ferry.dcp.read_committed(self.folder(node))
            mine = {e.path for e in index.files.values() if e.host == node or e.rank < 0}
            for name in os.listdir(self.folder(node)):
                if name.startswith("__") and name not in mine:
                    os.unlink(os.path.join(self.folder(node), name))


def read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def assert_loaded(job: Job, ranks: int) -> list[int]:
    if job.returncodes != [0] * ranks or len(job.results) != ranks:
        fail(f"{job.name}: return codes {job.returncodes}, {len(job.results)} results, "
             f"errors {job.errors()}\n{job.output()}")
    checked = [r["checked"] for r in job.results]
    if checked != [CHECKED] * ranks:
        fail(f"{job.name}: tensors checked bit-exact per rank {checked}, not {CHECKED} each")
    return [r["fetched_bytes"] for r in job.results]


LISTENING = re.compile(r"net: listening on (\S+)")


TRANSPORTS = re.compile(r"authenticated; UCX transports: (.*)")


def listening(job: Job, rank: int) -> list[str]:
    return LISTENING.findall(job.logs[rank])


def bridge_bytes(ports: list[str]) -> int:
    """Bytes the bridge took in from the nodes' veths so far (the kernel's count, this
    driver's namespace is the bridge's): what crossed the network, headers included."""
    total = 0
    for port in ports:
        with open(f"/sys/class/net/{port}/statistics/rx_bytes") as f:
            total += int(f.read())
    return total


def main() -> int:
    global phase
    ns_a, iface_a, ns_b, iface_b, work = sys.argv[1:6]
    watchdog()
    started = time.monotonic()
    c = Cluster({"node0": ns_a, "node1": ns_b}, {"node0": iface_a, "node1": iface_b}, work)
    # three_nodes.sh's veth pairs: "<tag><n>n" in a node's namespace, "<tag><n>s" on the bridge.
    ports = [iface_a[:-1] + "s", iface_b[:-1] + "s"]

    # --- 1. save at 4 ranks, load at 2 ranks placed on the other nodes --------------------
    phase = "save at 4 ranks"
    t = time.monotonic()
    job = c.run("save", "save", SAVE_LAYOUT)
    if job.returncodes != [0] * 4 or [r.get("tensors") for r in job.results] != [40] * 4:
        fail(f"save: return codes {job.returncodes}\n{job.output()}")
    large = {"node0": ["__0_0.distcp", "__1_0.distcp"], "node1": ["__2_0.distcp", "__3_0.distcp"]}
    for node, names in large.items():
        here = sorted(n for n in os.listdir(c.folder(node)) if n.endswith("_0.distcp"))
        if here != names:
            fail(f"save: {node}'s folder holds {here}, not {names}")
    say(f"ok: saved at 4 ranks, 2 per namespace, each node's shards in its own folder "
        f"({time.monotonic() - t:.1f} s)")

    phase = "load at 2 ranks on the other nodes"
    t = time.monotonic()
    crossed = bridge_bytes(ports)
    job = c.run("load2", "load", ["node1", "node0"])
    crossed = bridge_bytes(ports) - crossed
    fetched = assert_loaded(job, 2)
    # Rank 0 (rows of saved ranks 0-1) runs in node1's namespace: node1 fetched node0's large
    # shards, and node0 (rank 1) node1's.
    want = [c.size("node0", *large["node0"]), c.size("node1", *large["node1"])]
    if not (fetched[0] >= want[0] > 0 and fetched[1] >= want[1] > 0):
        fail(f"load2: fetched_bytes {fetched}, want at least {want} (the other node's shards)")
    for node, other in (("node0", "node1"), ("node1", "node0")):
        for name in large[other]:
            if c.size(node, name) != c.size(other, name):
                fail(f"load2: {node} lacks {other}'s {name} after the load")
    # The file servers: rank 0 leads node1 (ns b), rank 1 node0 (ns a).
    for rank, node, other_rank in ((0, "node1", 1), (1, "node0", 0)):
        bound = listening(job, rank)
        if len(bound) != 1:
            fail(f"load2: rank {rank} ({node}) logged {len(bound)} 'net: listening on' lines, "
                 f"want 1 (its node's file server)\n{job.output()}")
        host, _, port = bound[0].rpartition(":")
        if host != NODE_IP[node]:
            fail(f"load2: {node}'s file server listened on {bound[0]}, not on its namespace's "
                 f"address {NODE_IP[node]} (neither loopback nor 0.0.0.0 reach across nodes "
                 f"as an advertised address)")
        # The other node's leader connected to exactly that address, from its namespace.
        if f"{bound[0]} authenticated" not in job.logs[other_rank]:
            fail(f"load2: rank {other_rank}'s log does not show it reached {node}'s server at "
                 f"{bound[0]}\n{job.output()}")
    # The bytes went over the bridge (not a shared-memory transport between the namespaces).
    if crossed < sum(fetched):
        fail(f"load2: the bridge carried {crossed} bytes, less than the {sum(fetched)} fetched")
    transports = sorted({m for log in job.logs for m in TRANSPORTS.findall(log)})
    say(f"ok: load at 2 ranks on the other nodes, bit-exact ({CHECKED} tensors per rank), "
        f"fetched {fetched} bytes from file servers at {listening(job, 1)[0]} (node0) and "
        f"{listening(job, 0)[0]} (node1), {crossed} bytes over the bridge, UCX transports "
        f"{transports} ({time.monotonic() - t:.1f} s)")

    # --- 2. load at 8 ranks, interleaved ---------------------------------------------------
    phase = "load at 8 ranks, interleaved"
    t = time.monotonic()
    c.forget_fetched()
    job = c.run("load8", "load", ["node0", "node1"] * 4)
    fetched = assert_loaded(job, 8)
    if not (fetched[0] > 0 and fetched[1] > 0 and not any(fetched[2:])):
        fail(f"load8: fetched_bytes {fetched}: want the two leaders (ranks 0, 1) > 0, "
             f"the rest 0")
    for rank, node in ((0, "node0"), (1, "node1")):
        bound = listening(job, rank)
        if [b.rpartition(":")[0] for b in bound] != [NODE_IP[node]]:
            fail(f"load8: rank {rank} ({node}) listened on {bound}, want one server on "
                 f"{NODE_IP[node]}")
    if any(listening(job, rank) for rank in range(2, 8)):
        fail("load8: a rank other than the nodes' leaders started a file server")
    say(f"ok: load at 8 ranks, 4 per namespace interleaved, bit-exact, leaders fetched "
        f"{fetched[:2]} bytes, the others nothing ({time.monotonic() - t:.1f} s)")

    # --- 3. node1 down ---------------------------------------------------------------------
    phase = "load with node1 down"
    t = time.monotonic()
    c.forget_fetched()
    port = 29999  # nothing listens there: no process runs in node1's namespace now
    address = f"{NODE_IP['node1']}:{port}"
    token = os.path.join(work, "peer-token")  # the peer's secret, as `ferry.dcp serve` takes
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    job = c.run("down", "load", ["node0", "node0"], "--peers", json.dumps({"node1": address}),
                "--timeout-s", "5", env={"FERRY_TOKEN_FILE": token})
    errors = job.errors()
    if 0 in job.returncodes or len(errors) != 2:
        fail(f"down: return codes {job.returncodes}, errors {errors}: want every rank to fail"
             f"\n{job.output()}")
    for e in errors:
        if not (address in e and all(n in e for n in large["node1"])):
            fail(f"down: an error does not name {address} and {large['node1']}: {e}")
    gained = [n for n in large["node1"]
              if os.path.exists(os.path.join(c.folder("node0"), n))]
    if gained:
        fail(f"down: node0's folder gained {gained}")
    why = next((line.strip() for line in errors[0].splitlines() if address in line), "")
    say(f"ok: node1 down: both ranks failed, naming {address} and node1's files "
        f"({time.monotonic() - t:.1f} s): {why[:400]}")

    say(f"ok: all checks passed in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

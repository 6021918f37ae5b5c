"""Run by verl_stack_netns.sh, in the actor's network namespace: ferry's checkpoint-engine backend
disaggregated under verl's REAL classes and REAL Ray spanning three network namespaces (one Ray
node each, joined over the namespaces' bridge only):

    ns actor  10.77.0.1: Ray head, this driver, the trainer (TrainerWorker, a verl Worker)
    ns node-b 10.77.0.2: Ray node; a verl RayWorkerGroup of 2 CpuCheckpointEngineWorker
                          (verl's CheckpointEngineWorker + ferry.verl.cpu_rollout's adapter)
    ns node-c 10.77.0.3: Ray node; likewise 2

Every update is verl's own CheckpointEngineManager.update_weights (prepare, build_topology,
init_process_group, send/receive, finalize, all through Ray). engine_kwargs are verl's: one dict
for every rank (token_file, the master's interface, timeout_s), no node_id: ranks are told apart
by ferry's node_identity(), which includes the network namespace. So the master must serve one
net session to one relay per rollout node (hosted by the node's first rank), and each relay
republishes over shm to its node's two ranks.

Checks (prints "ok: ..." per check, exits 1 on the first failure, 0 when all passed):
1. Ray spans the namespaces: 3 live nodes, each worker process in the namespace its placement
   group's custom resource names.
2. Three updates, the trainer's weights changed before each: every rollout rank's adapter hash
   equals the trainer's (sha256 over every tensor's bytes), at that global_steps, every tensor
   received in the trainer's order; after the last, one rank per node also compared tensor by
   tensor, its weights fetched through Ray's object store across the namespaces. The master
   wrote each update once per node (ferry/net_bytes == 2 x model; no shm session on the
   actor's node); updates 2-3 streamed.
3. node-b's second rank (its relay's local receiver 1) SIGKILLed after loading 3 tensors of an
   update: the trainer's send_weights fails within KILL_BOUND_S naming that receiver and its
   pid; verl's manager raises and returns within HANG_S.
4. verl's remove_replicas / add_replicas put a new rank on node-b; the next two updates are
   exact on every rank, the new one included.
The whole run is bounded by DEADLINE_S (a watchdog exits 1 naming the phase it was in).

    ip netns exec NS_ACTOR python3 verl_stack_netns.py NS_ACTOR NS_NODE_B NS_NODE_C WORK_DIR
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import ray
import torch

import ferry.verl.checkpoint_engine  # noqa: F401  (registers "ferry" in the driver too)
from ferry.verl.cpu_rollout import CpuCheckpointEngineWorker, CpuRolloutReplica
from verl.checkpoint_engine.base import CheckpointEngineManager
from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
from verl.workers.config import CheckpointEngineConfig, HFModelConfig, RolloutConfig

from verl_stack_workers import NodePool, TrainerWorker

ACTOR_IP = "10.77.0.1"  # three_nodes.sh: the bridge in the actor's namespace
NODE_B_IP = "10.77.0.2"
RAY_PORT = 6379         # the head's GCS, in the actor's namespace (verl_stack_netns.sh)
ENGINE_TIMEOUT_S = 30   # engine_kwargs.ferry.timeout_s: a silent peer fails an update here
HANG_S = ENGINE_TIMEOUT_S + 15
KILL_BOUND_S = 10.0     # a killed rank is seen at once (socket EOF), relayed to the trainer
DEADLINE_S = float(os.environ.get("FERRY_VERL_STACK_DEADLINE_S", 240))
BUCKET_MB = 1           # the embedding and lm_head (2 MiB each) cross buckets

phase = "start"


def say(message: str) -> None:
    print(message, flush=True)


def watchdog() -> None:
    def expire() -> None:
        say(f"FAIL: still running after {DEADLINE_S:.0f} s, in phase: {phase}")
        os._exit(1)
    timer = threading.Timer(DEADLINE_S, expire)
    timer.daemon = True
    timer.start()


def tiny_model(path: str) -> str:
    """A tiny random Qwen2 (2 layers, hidden 128, vocab 4096; fp32, 5.3 MB), untied."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                         max_position_embeddings=256, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def named_netns(name: str) -> str:
    return f"net:[{os.stat(f'/var/run/netns/{name}').st_ino}]"


class Rollouts:
    """The rollout side: one verl RayWorkerGroup per node, each pinned to its Ray node."""

    def __init__(self, rollout_config, model_config) -> None:
        self.rollout_config, self.model_config = rollout_config, model_config
        self.next_replica_rank = 0
        self.groups: list = []  # keep the worker groups (their actors) alive

    def start(self, count: int, resource: str) -> list:
        """`count` replicas of one rank each on the node holding `resource`."""
        first = self.next_replica_rank
        self.next_replica_rank += count
        cls = RayClassWithInitArgs(cls=ray.remote(CpuCheckpointEngineWorker),
                                   rollout_config=self.rollout_config,
                                   model_config=self.model_config, first_replica_rank=first)
        wg = RayWorkerGroup(resource_pool=NodePool(count, resource), ray_cls_with_init=cls,
                            use_gpu=False, device_name="cpu")
        self.groups.append(wg)
        return [CpuRolloutReplica(first + i, self.rollout_config, self.model_config,
                                  workers=[w]) for i, w in enumerate(wg.workers)]


def adapter(replica) -> dict:
    return ray.get(replica.workers[0].adapter_state.remote(), timeout=60)


def assert_exact(trainer, replicas: list, step: int) -> dict:
    """Every rank of `replicas` completed update `step` and holds the trainer's weights."""
    expected = trainer.state()[0]
    for replica in replicas:
        state = adapter(replica)
        where = f"rollout replica {state['replica_rank']} (pid {state['pid']})"
        assert state["error"] is None, f"{where}: its last update raised {state['error']}"
        assert state["global_steps"] == step, (
            f"{where}: last complete update is global_steps {state['global_steps']}, not {step}")
        assert state["received"] == expected["names"], (
            f"{where}: received {len(state['received'])} tensors, not the trainer's "
            f"{len(expected['names'])} in its order: {state['received'][:3]}...")
        assert state["hash"] == expected["hash"], (
            f"{where}: weight hash {state['hash'][:16]} != the trainer's {expected['hash'][:16]}")
    return expected


def run_update(manager, step: int, result: dict) -> None:
    try:
        result["metrics"] = manager.update_weights(global_steps=step)
    except BaseException as e:  # inspected by the caller
        result["error"] = e
    result["ended"] = time.monotonic()


def update(manager, trainer, step: int) -> dict:
    """One update through verl's manager, bounded by HANG_S; returns its metrics."""
    result: dict = {}
    thread = threading.Thread(target=run_update, args=(manager, step, result), daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"update {step}: manager.update_weights hung {HANG_S} s"
    if "error" in result:
        raise AssertionError(f"update {step} failed; the trainer's send_weights: "
                             f"{trainer.state()[0]['error']}; the manager raised "
                             f"{type(result['error']).__name__}: {str(result['error'])[-400:]}")
    return result["metrics"]


def main() -> int:
    global phase
    ns_actor, ns_b, ns_c, work = sys.argv[1:5]
    watchdog()
    started = time.monotonic()

    phase = "connecting to Ray"
    ray.init(address=f"{ACTOR_IP}:{RAY_PORT}", _node_ip_address=ACTOR_IP,
             logging_level="ERROR", log_to_driver=False)
    nodes = sorted((n["NodeManagerAddress"], sorted(k for k in n["Resources"]
                                                    if k.startswith("ns_")))
                   for n in ray.nodes() if n["Alive"])
    assert nodes == [(ACTOR_IP, ["ns_actor"]), (NODE_B_IP, ["ns_node_b"]),
                     ("10.77.0.3", ["ns_node_c"])], f"Ray's live nodes: {nodes}"

    phase = "starting the trainer and the rollout workers"
    token = os.path.join(work, "ferry_token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("netns-token-" + os.urandom(16).hex())
    model_path = tiny_model(os.path.join(work, "tiny_qwen2"))
    model_config = HFModelConfig(path=model_path, load_tokenizer=False,
                                 override_config={"attn_implementation": "eager"})
    # verl's config: one engine_kwargs for every rank, no per-rank node_id.
    ce_config = CheckpointEngineConfig(
        backend="ferry", custom_backend_module="ferry.verl.checkpoint_engine",
        update_weights_bucket_megabytes=BUCKET_MB,
        engine_kwargs={"ferry": {"token_file": token, "interface": ACTOR_IP,
                                 "timeout_s": ENGINE_TIMEOUT_S}})
    rollout_config = RolloutConfig(name="vllm", tensor_model_parallel_size=1,
                                   load_format="dummy", checkpoint_engine=ce_config)
    trainer = RayWorkerGroup(
        resource_pool=NodePool(1, "ns_actor"),
        ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(TrainerWorker),
                                               model_path=model_path, engine_config=ce_config),
        use_gpu=False, device_name="cpu")
    rollouts = Rollouts(rollout_config, model_config)
    node_b = rollouts.start(2, "ns_node_b")
    node_c = rollouts.start(2, "ns_node_c")
    replicas = node_b + node_c
    first = trainer.state()[0]
    where = {named_netns(ns_actor): "actor", named_netns(ns_b): "node-b",
             named_netns(ns_c): "node-c"}
    placed = [where.get(netns_of(first["pid"]))] + [
        where.get(netns_of(adapter(r)["pid"])) for r in replicas]
    assert placed == ["actor", "node-b", "node-b", "node-c", "node-c"], (
        f"processes in namespaces {placed}, not actor, 2 x node-b, 2 x node-c")
    assert first["netns"] == named_netns(ns_actor)
    assert all(adapter(r)["hash"] != first["hash"] for r in replicas), "rollouts start equal"
    say(f"ok: Ray spans 3 network namespaces (head + 2 nodes); trainer in the actor's, 2 "
        f"rollout ranks in each of node-b and node-c ({time.monotonic() - started:.0f} s)")

    phase = "updates 1-3"
    manager = CheckpointEngineManager(ce_config, trainer, list(replicas))
    step = 0
    seconds = []
    for _ in range(3):
        step += 1
        trainer.perturb(seed=step)
        t = time.monotonic()
        metrics = update(manager, trainer, step)
        seconds.append(time.monotonic() - t)
        expected = assert_exact(trainer, replicas, step)
        assert metrics.get("ferry/net_bytes") == 2 * expected["bytes"], (
            f"update {step}: net_bytes {metrics.get('ferry/net_bytes')} is not one model "
            f"({expected['bytes']} B) per rollout node: {metrics}")
        assert "ferry/shm_bytes" not in metrics, f"an shm session on the actor's node: {metrics}"
        assert metrics.get("ferry/streamed") == (1.0 if step > 1 else 0.0), metrics
    # Byte for byte too, fetched through Ray's object store (5 MB, not inlined) from a rank
    # of each node into the driver's namespace.
    want = trainer.weights()[0]
    for replica in (node_b[0], node_c[0]):
        got = ray.get(replica.workers[0].adapter_weights.remote(), timeout=60)
        assert sorted(got) == sorted(want), "the rollout model's names differ"
        bad = [n for n, t in want.items() if not torch.equal(got[n], t)]
        assert not bad, f"replica {adapter(replica)['replica_rank']}: differs in {bad[:3]}"
    say(f"ok: 3 updates through verl's CheckpointEngineManager to 2 nodes x 2 ranks, every "
        f"adapter hash == the trainer's (a rank per node also tensor by tensor, fetched "
        f"through Ray's object store); one copy per node over the net session, update 1 "
        f"staged, 2-3 streamed (manager: {', '.join(f'{s:.1f}' for s in seconds)} s)")

    phase = "a rollout rank killed mid-update"
    victim = node_b[1]
    state = adapter(victim)
    pid = state["pid"]
    ray.get(victim.workers[0].configure_adapter.remote(pause_on_update=state["updates"] + 1,
                                                       pause_after_tensors=3))
    step += 1
    trainer.perturb(seed=step)
    result: dict = {}
    thread = threading.Thread(target=run_update, args=(manager, step, result), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not adapter(victim)["paused"]:
        assert time.monotonic() < deadline, "node-b's rank 1 never paused mid-update"
        assert thread.is_alive(), f"the update ended before the rank paused: {result}"
        time.sleep(0.05)
    say(f"   SIGKILL to node-b's rank 1 (pid {pid}), paused mid-update: Ray's raylet reports "
        "its worker's death")
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(HANG_S)
    assert not thread.is_alive(), f"manager.update_weights hung {HANG_S} s after the kill"
    assert "error" in result, "manager.update_weights succeeded with a rank killed"
    # verl's manager may raise first (Ray reports the actor's death to its ray.get at once);
    # the trainer's send_weights hears of it through node-b's relay: wait for it, bounded.
    record = trainer.state()[0]
    while record["error"] is None and time.monotonic() < killed_at + KILL_BOUND_S:
        time.sleep(0.05)
        record = trainer.state()[0]
    assert record["error"] is not None, (
        f"the trainer's send_weights did not fail within {KILL_BOUND_S} s of the kill (the "
        f"manager raised {result['error']!r})")
    took = record["failed_at"] - killed_at
    assert took <= KILL_BOUND_S, f"the trainer failed {took:.1f} s after the kill"
    assert f"pid {pid}" in record["error"] and "local receiver 1" in record["error"], (
        f"the trainer's error does not name node-b's local receiver 1 (pid {pid}): "
        f"{record['error']}")
    assert NODE_B_IP in record["error"], f"the trainer's error does not name node-b: {record}"
    for replica in replicas:
        if replica is not victim:
            other = adapter(replica)
            say(f"   rollout replica {other['replica_rank']}: "
                f"{other['error'] or 'had the whole update'}")
    say(f"ok: rollout rank killed mid-update (pid {pid}): the trainer failed {took:.2f} s "
        f"later: {record['error'][:200]}")

    phase = "updates after the kill"
    manager.remove_replicas([victim])
    replacement = rollouts.start(1, "ns_node_b")
    assert where.get(netns_of(adapter(replacement[0])["pid"])) == "node-b"
    manager.add_replicas(replacement)
    replicas = [r for r in replicas if r is not victim] + replacement
    for _ in range(2):
        step += 1
        trainer.perturb(seed=step)
        update(manager, trainer, step)
        assert_exact(trainer, replicas, step)
    say("ok: a new rank on node-b through verl's remove_replicas / add_replicas; the next 2 "
        "updates exact on every rank")
    say(f"all verl-stack netns checks passed in {time.monotonic() - started:.0f} s "
        "(after Ray's start)")
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except AssertionError as e:
        say(f"FAIL ({phase}): {e}")
        code = 1
    except BaseException:  # Ray's or verl's own error: its traceback
        import traceback
        traceback.print_exc()
        say(f"FAIL ({phase}): an exception (above)")
        code = 1
    sys.stdout.flush()
    os._exit(code)  # not ray.shutdown(): the shell ends every process of the namespaces

"""Several senders (engine_kwargs.ferry.senders): S actor ranks each send a disjoint part of
every update, and every rollout rank merges the parts with ferry.MultiReceiver.

Which ranks send: the master and the S-1 actor ranks after it (in the worker group's order,
wrapping around). Which tensors each sends: every sender iterates the whole generator (as
every actor rank does anyway), and each tensor, in the order yielded, goes to the sender that
has the fewest bytes of this update so far (the lowest index on a tie; a name yielded again
goes where it went first). The rule reads only the update's own names and sizes, so every
sender computes the same parts without exchanging anything, a restarted rank included, and an
update with the same manifest as the last gives every sender the same part as the last: its
Senders stream it (Sender.send_update). ferry.split_into_parts balances a little better but
needs the whole manifest before the first tensor is sent, which the first update does not
have; a rule that changed between the first and later updates would change every part.

Topology: each sender serves one session. Where every rollout rank runs on its node, an shm
session; else a net session, and every node with rollout ranks (its own too) gets one relay of
it (ferry.Relay, hosted by the node's first rollout rank, which so hosts one relay per such
sender). A rollout rank joins S sessions, one per sender: the sender's shm session or its
node's relay of the sender. It has one receiver id, its index among its node's rollout
ranks, which is its id in each of them.

Why not an shm session for the sender's own node beside the net session, as one sender has:
MultiReceiver.receive_update acknowledges each sender's last round only once every sender's
last round ended (so a sender that dies fails the others' updates too), and a Sender streaming
one update into two sessions finishes them in turn, the second only once the first was
acknowledged: with two such senders, each one's first session waits on the other's second.
One session per sender has no such cycle; the sender's node pays one relay hop (loopback)
instead.
"""

from __future__ import annotations

import re
from typing import Any, AsyncIterator, Iterable

from .. import _ferry
from .._tensors import _error


def parse_senders(value: Any) -> int | str:
    """engine_kwargs.ferry.senders: a positive int or "all"."""
    if isinstance(value, str) and value.strip().lower() == "all":
        return "all"
    count = 0
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, str) and value.strip().isdigit():
        count = int(value)
    if count < 1:
        raise _error(_ferry.InvalidArgumentError,
                     f"engine_kwargs.ferry.senders={value!r}: expected a positive number of "
                     "actor ranks or 'all'")
    return count


def sender_count(setting: int | str, trainer_world: int) -> int:
    """How many actor ranks send, for the master's setting."""
    if setting == "all":
        return trainer_world
    if int(setting) > trainer_world:
        raise _error(_ferry.InvalidArgumentError,
                     f"build_topology: engine_kwargs.ferry.senders={setting}, but the trainer "
                     f"has {trainer_world} actor rank(s)")
    return int(setting)


class Split:
    """Deals one update's tensors to `count` senders (module docstring)."""

    def __init__(self, count: int) -> None:
        self.loads = [0] * count
        self.tensors = [0] * count
        self._owner: dict[str, int] = {}

    def owner(self, name: str, nbytes: int) -> int:
        k = self._owner.get(name)
        if k is None:
            k = min(range(len(self.loads)), key=lambda i: (self.loads[i], i))
            self._owner[name] = k
        self.loads[k] += nbytes
        self.tensors[k] += 1
        return k


async def part_of(weights: Iterable | AsyncIterator, split: Split, index: int) -> AsyncIterator:
    """The tensors of `weights` that sender `index` sends; pulls every one (the generator may
    run collectives every rank must join)."""
    if hasattr(weights, "__aiter__"):
        async for name, tensor in weights:
            if split.owner(name, tensor.numel() * tensor.element_size()) == index:
                yield name, tensor
    else:
        for name, tensor in weights:
            if split.owner(name, tensor.numel() * tensor.element_size()) == index:
                yield name, tensor


def plan_parts(trainer: list[dict], rollout: list[dict], master: dict, count: int,
               next_epoch: Any) -> tuple[dict[str, list], dict[str, list]]:
    """build_topology with `count` senders (module docstring); next_epoch is
    _sessions._next_epoch."""
    first = trainer.index(master)
    ranks = [(first + j) % len(trainer) for j in range(count)]
    nodes: list[str] = []  # rollout nodes, in the order of their first rank
    for m in rollout:
        if m["node"] not in nodes:
            nodes.append(m["node"])
    on_node = {node: [i for i, m in enumerate(rollout) if m["node"] == node] for node in nodes}
    senders = []
    for k, index in enumerate(ranks):
        m = trainer[index]
        local = nodes == [m["node"]]  # every rollout rank on its node: shm
        remote = [] if local else nodes
        if remote and not m.get("sender_net"):
            raise _error(_ferry.InvalidArgumentError,
                         f"build_topology: rollout ranks run on other nodes, but sender {k}'s "
                         f"hostname '{m.get('host')}' does not resolve to an address to serve "
                         "them on: set engine_kwargs.ferry.interface")
        senders.append({
            "rank": index, "node": m["node"], "pid": m["pid"],
            "name": f"trainer rank {index} (pid {m['pid']} on {m.get('host')})",
            "shm": m["sender_shm"], "net": m.get("sender_net"),
            "shm_receivers": len(rollout) if local else 0, "net_receivers": len(remote),
            "relays": [{"node": node, "receivers": len(on_node[node]),
                        "local": f"{rollout[on_node[node][0]]['relay']}-s{k}"}
                       for node in remote]})
    members = ([[m["node"], m["pid"]] for m in rollout]
               + [["sender", s["node"], s["pid"]] for s in senders])
    others = [trainer[i] for i in ranks[1:]]
    plan = {"senders": senders, "members": members,
            "master": f"trainer master rank (pid {master['pid']} on {master.get('host')})",
            "epoch": next_epoch(master, rollout + others, members)}
    role = ["idle"] * len(trainer)
    sender_of = [-1] * len(trainer)
    for k, index in enumerate(ranks):
        role[index] = "master" if k == 0 else "sender"
        sender_of[index] = k
    addresses, relays, receiver_ids = [], [], []
    for i, m in enumerate(rollout):
        receiver_ids.append(on_node[m["node"]].index(i))
        mine, hosted = [], []
        for k, s in enumerate(senders):
            if s["shm_receivers"]:
                mine.append(s["shm"])
                continue
            relay_id = [r["node"] for r in s["relays"]].index(m["node"])
            relay = s["relays"][relay_id]
            mine.append(relay["local"])
            if receiver_ids[-1] == 0:
                hosted.append({"upstream": s["net"], "relay_id": relay_id, **relay})
        addresses.append(mine)
        relays.append(hosted)
    world = len(rollout)
    trainer_kwargs = {"role": role, "plan": [plan] * len(trainer), "sender": sender_of}
    rollout_kwargs = {"role": ["receiver"] * world, "kind": ["parts"] * world,
                      "receiver_id": receiver_ids, "addresses": addresses,
                      "part_relays": relays, "plan": [plan] * world,
                      "rank": list(range(world))}
    return trainer_kwargs, rollout_kwargs


def sender_context(error: BaseException, plan: dict) -> str:
    """Which trainer rank the MultiReceiver's error names ("sender 1 (...)"), or every
    sender's rank where it names none."""
    senders = plan["senders"]
    found = re.search(r"\bsender (\d+) \(", str(error))
    if found and int(found.group(1)) < len(senders):
        k = int(found.group(1))
        return f"sender {k} is {senders[k]['name']}"
    return "the update's senders: " + ", ".join(
        f"sender {k} is {s['name']}" for k, s in enumerate(senders))


def part_metrics(metrics: dict[str, Any], index: int, split: Split) -> dict[str, Any]:
    """send_weights' metrics of sender `index`: ferry/bytes and ferry/tensors are the whole
    update's (every sender saw every tensor), the rest this sender's, and
    ferry/sender<index>/* what it sent itself."""
    own = {f"ferry/sender{index}/{key[len('ferry/'):]}": value
           for key, value in metrics.items() if key != "ferry/gbps"}
    total = sum(split.loads)
    return {**metrics, **own, "ferry/bytes": total, "ferry/tensors": sum(split.tensors),
            "ferry/senders": len(split.loads)}

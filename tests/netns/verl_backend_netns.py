"""Run by verl_backend_netns.sh: the checkpoint-engine backend with its actor and its two
rollout nodes (2 ranks each) in three network namespaces. Checks several updates bit-exact
(the first through staging, later ones streamed), then a rollout rank killed mid-update: a
named error on the actor and on the killed rank's node, and the next update succeeds once
the rank is back. Prints "ok: ..." per check; exits 1 on the first failure.

    python3 verl_backend_netns.py NS_ACTOR NS_NODE_B NS_NODE_C WORK_DIR
"""

from __future__ import annotations

import os
import sys

from test_checkpoint_engine import (KILL_BOUND_S, _assert_bit_exact, _expected, _Manager,
                                    _Rank, _weights)

ACTOR_IP = "10.77.0.1"  # three_nodes.sh's bridge in the actor's namespace


def main() -> int:
    ns_actor, ns_b, ns_c, work = sys.argv[1:5]
    token = os.path.join(work, "token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("netns-token-" + os.urandom(16).hex())
    net = {"token_file": token, "interface": ACTOR_IP, "timeout_s": 60}
    nodes = [(ns_b, "node-b"), (ns_b, "node-b"), (ns_c, "node-c"), (ns_c, "node-c")]
    manager = _Manager([_Rank(is_master=True, netns=ns_actor, node_id="node-a", **net)],
                       [_Rank(netns=ns, node_id=node, **net) for ns, node in nodes])
    try:
        for step in (1, 2, 3):
            result = manager.update(step)
            _assert_bit_exact(result, step)
            metrics = result["sent"][0][1]
            model = sum(t.numel() * t.element_size() for _, t in _weights(step))
            assert metrics["ferry/net_bytes"] == 2 * model, metrics  # once per node
            assert metrics["ferry/streamed"] == (1.0 if step > 1 else 0.0), metrics
        print(f"ok: 3 updates to 2 nodes x 2 ranks over the network, bit-exact "
              f"(update 1 staged, 2-3 streamed; {metrics['ferry/gbps']:.2f} GB/s)")

        # node-b's second rank dies after taking 3 tensors of update 4.
        result = manager.update(4, die={1: 3})
        assert result["seconds"] < KILL_BOUND_S, result
        assert result["received"][1] == ("dead", 3), result["received"]
        sent = result["sent"][0]
        assert sent[0] == "error" and sent[1].endswith("Error") and sent[2], sent
        # Named: the lost rank, as node-b's relay reported it (the relay keeps its link open
        # until the actor has read the report), and the relay on node-b that reported it.
        assert "relay 0: " in sent[2] and "local receiver 1" in sent[2], \
            f"the actor does not name the lost rank through its relay: {sent}"
        assert "10.77.0.2" in sent[2], f"the actor does not name node-b: {sent}"
        # node-b's relay host saw its receiver go: it either had the whole update (it
        # acknowledged first) or names the failure; node-c's ranks likewise.
        for rank in (0, 2, 3):
            status = result["received"][rank]
            print(f"   rollout rank {rank}: {status[0]} {status[1:] if status[0] != 'ok' else ''}")
            if status[0] == "ok":
                assert status[1] == _expected(4), f"rank {rank}: part of an update"
            else:
                assert status[1].endswith("Error") and status[2], (rank, status)
        print(f"ok: a rollout rank killed mid-update: actor says {sent[1]}: {sent[2][:160]}")

        manager.rollouts[1] = _Rank(netns=ns_b, node_id="node-b", **net)  # back
        for step in (5, 6):
            result = manager.update(step)
            _assert_bit_exact(result, step)
        print("ok: the next updates after the rank came back are bit-exact")
        return 0
    except AssertionError as e:
        print(f"FAIL: {e}")
        return 1
    finally:
        manager.stop()


if __name__ == "__main__":
    sys.exit(main())

"""Several senders (engine_kwargs.ferry.senders=2) under verl's real manager: both ranks of
verl's FSDP2 trainer send, each a disjoint part of every update, and every rollout rank
merges the parts (ferry.MultiReceiver); a sender killed mid-update is named at the rollout
ranks and at the other sender, and a new trainer worker group then updates every rank."""

from __future__ import annotations

import ray

from verl_stack_checks import (ENGINE_TIMEOUT_S, assert_exact, kill_pid, settled, start_update,
                               trainer_state, update, wait_for, workers_of)

FAIL_WITHIN_S = 5.0
HANG_S = ENGINE_TIMEOUT_S + 15


def test_two_trainer_ranks_both_send(stack):
    """Three updates with an AdamW step between them: both trainer ranks send (verl merges
    their metrics: ferry/sender0/* and ferry/sender1/*), the parts add up to the model, and
    every rollout rank holds every trainer tensor byte for byte."""
    trainer = stack.new_trainer(2, senders=2)
    replicas = stack.pool(2)
    manager = stack.manager(trainer, replicas)
    expected = trainer_state(trainer)
    model = sum(t.numel() * t.element_size() for t in expected.values())
    for i in range(3):
        if i:
            trainer.optimizer_step(seed=500 + i)
        step = stack.next_step()
        metrics = manager.update_weights(global_steps=step)
        assert_exact(trainer, replicas, step, ordered=False)
        parts = [metrics[f"ferry/sender{k}/bytes"] for k in range(2)]
        links = [metrics[f"ferry/sender{k}/shm_bytes"] for k in range(2)]
        print(f"update {i + 1}: part bytes {parts}, link bytes {links}, "
              f"streamed {metrics['ferry/streamed']}")
        assert metrics["ferry/senders"] == 2 and metrics["ferry/tensors"] == len(expected)
        assert sum(parts) == model == metrics["ferry/bytes"], (parts, model)
        assert all(p > 0 for p in parts), parts
        assert links == [2 * p for p in parts], "each part once per rollout rank"
        assert metrics["ferry/streamed"] == (0.0 if i == 0 else 1.0), metrics


def test_a_killed_sender_is_named_and_a_new_trainer_takes_over(stack):
    """Trainer rank 1 pauses after yielding its last tensor (every collective of verl's
    generator done, so rank 0 is not stopped by a collective that lost its peer) and is
    SIGKILLed before its round ends: every rollout rank's update fails within 5 s naming it
    ("trainer rank 1 (pid P"), the manager raises, and a new 2-rank trainer with senders=2
    then updates every rank exactly."""
    trainer = stack.new_trainer(2, senders=2)
    replicas = stack.pool(2)
    manager = stack.manager(trainer, replicas)
    assert_exact(trainer, replicas, update(stack, manager), ordered=False)

    records = trainer.record()
    pid = records[1]["pid"]
    tensors = len(trainer_state(trainer))
    trainer.configure(pause_on_update=records[1]["updates"] + 1, pause_after_tensors=tensors,
                      pause_rank=1)
    pending = start_update(stack, manager)
    wait_for(lambda: trainer.record()[1]["paused"], 60, "trainer rank 1 to pause")
    killed_at = kill_pid(pid)
    finished = pending.wait(HANG_S)
    states = [settled(lambda w=w: ray.get(w.adapter_state.remote()), killed_at, FAIL_WITHIN_S)
              for w in workers_of(replicas)]
    master = settled(lambda: _rank0(trainer), killed_at, FAIL_WITHIN_S)
    problems = []
    if not finished:
        problems.append(f"manager.update_weights still blocked {HANG_S} s after the kill")
    elif pending.error is None:
        problems.append("manager.update_weights succeeded with a sender killed")
    named = f"trainer rank 1 (pid {pid} "
    for state in states:
        where = f"rollout replica {state['replica_rank']} (pid {state['pid']})"
        print(f"{where}: {state['error']}")
        if state["error"] is None:
            problems.append(f"{where}: its update did not fail")
        elif state["failed_at"] - killed_at > FAIL_WITHIN_S:
            problems.append(f"{where} failed {state['failed_at'] - killed_at:.1f} s after")
        elif named not in state["error"]:
            problems.append(f"{where}: its error does not name {named}: {state['error']}")
    # Rank 1 paused after its last tensor was delivered, before its round's END: rank 0's
    # part was through too, but no rollout rank acknowledges a sender's last round before
    # every sender's ended, so rank 0's send_weights fails as well, naming rank 1.
    print(f"trainer rank 0: {master['error']}")
    if master["error"] is None:
        problems.append("trainer rank 0's send_weights succeeded with sender 1 killed")
    elif named not in master["error"]:
        problems.append(f"trainer rank 0's send_weights does not name {named}: "
                        f"{master['error']}")
    if finished:
        try:
            successor = stack.new_trainer(2, senders=2)
            assert_exact(successor, replicas, update(stack, stack.manager(successor, replicas)),
                         ordered=False)
        except Exception as e:  # reported with the rest
            problems.append(f"the new trainer's update failed: {type(e).__name__}: {e}")
    assert not problems, "\n".join(problems)


def _rank0(trainer) -> dict:
    """Trainer rank 0's record(), with rank 1 dead (record() on every rank would fail)."""
    return ray.get(trainer.workers[0].record.remote())

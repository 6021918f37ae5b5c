"""The trainer (master rank) SIGKILLed in the middle of an update, under verl's real manager:
every rollout rank's update must fail within 5 s, naming the trainer ("pid P", as the trainer
names a lost rollout rank; the abstract socket's name holds the pid too, but only by
construction), and a new trainer worker group must then update every rank exactly."""

from __future__ import annotations

import ray

from verl_stack_checks import (ENGINE_TIMEOUT_S, assert_exact, kill_pid, settled, start_update,
                               update, wait_for, workers_of)

FAIL_WITHIN_S = 5.0
HANG_S = ENGINE_TIMEOUT_S + 15


def test_trainer_killed_mid_update(stack):
    trainer = stack.new_trainer(1)  # this test's own: it is killed
    replicas = stack.pool(2)
    manager = stack.manager(trainer, replicas)
    assert_exact(trainer, replicas, update(stack, manager))

    record = trainer.record()[0]
    pid = record["pid"]
    trainer.configure(pause_on_update=record["updates"] + 1, pause_after_tensors=5)
    trainer.optimizer_step(seed=800)
    pending = start_update(stack, manager)
    wait_for(lambda: trainer.record()[0]["paused"], 60, "the trainer to pause mid-update")
    killed_at = kill_pid(pid)
    finished = pending.wait(HANG_S)
    states = [settled(lambda w=w: ray.get(w.adapter_state.remote()), killed_at, FAIL_WITHIN_S)
              for w in workers_of(replicas)]
    for state in states:
        took = "never" if state["failed_at"] is None else f"{state['failed_at'] - killed_at:.2f} s"
        print(f"trainer pid {pid} killed; rollout pid {state['pid']} failed {took} after: "
              f"{state['error']}")
    print(f"manager returned: {finished}; raised: {pending.error!r}")
    problems = []
    if not finished:
        problems.append(f"manager.update_weights still blocked {HANG_S} s after trainer pid "
                        f"{pid} was killed")
    elif pending.error is None:
        problems.append("manager.update_weights succeeded with the trainer killed")
    for state in states:
        where = f"rollout replica {state['replica_rank']} (pid {state['pid']})"
        if state["error"] is None:
            problems.append(f"{where}: its update did not fail")
            continue
        took = state["failed_at"] - killed_at
        if took > FAIL_WITHIN_S:
            problems.append(f"{where} failed {took:.1f} s after the kill")
        if f"pid {pid}" not in state["error"]:  # not only inside the session's address
            problems.append(f"{where}: its error does not name the trainer's pid {pid}: "
                            f"{state['error']}")
    if finished:  # a new trainer worker group takes over, whatever went wrong above
        try:
            successor = stack.new_trainer(1)
            assert_exact(successor, replicas,
                         update(stack, stack.manager(successor, replicas)))
        except Exception as e:  # reported with the rest
            problems.append(f"the new trainer's update failed: {type(e).__name__}: {e}")
    assert not problems, "\n".join(problems)

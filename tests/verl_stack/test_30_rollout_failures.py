"""A rollout rank that fails in the middle of an update, under verl's real manager: killed
(SIGKILL of its process), or its consumer (the server adapter loading the weights) raises.

Either way the trainer's send_weights must fail soon, naming the rollout rank (its pid) and,
for a raised exception, the exception; and the update after must work on every rank.
"""

from __future__ import annotations

import time
import uuid

import ray

from verl_stack_checks import (ENGINE_TIMEOUT_S, assert_exact, kill_pid, settled, start_update,
                               update, wait_for, workers_of)

FAIL_WITHIN_S = 5.0
# How long a test waits for the manager to return before calling it hung: past the engine's
# own timeout_s, after which a silent peer fails the update anyway.
HANG_S = ENGINE_TIMEOUT_S + 15


def _after(at: float | None, since: float | None) -> str:
    return "never" if at is None or since is None else f"{at - since:.2f} s"


def _adapter(worker) -> dict:
    return ray.get(worker.adapter_state.remote())


def test_rollout_killed_mid_update(stack):
    """Rollout replica 1 is SIGKILLed after loading 3 tensors of an update: the trainer's
    update fails within 5 s naming its pid; verl's remove_replicas / add_replicas then put a
    new replica in its place, and the next update is exact on every rank."""
    trainer = stack.trainer(1)
    trainer.configure()
    replicas = stack.pool(2)
    manager = stack.manager(trainer, replicas)
    assert_exact(trainer, replicas, update(stack, manager))  # sessions up, streamed next

    victim = replicas[1]
    worker = workers_of([victim])[0]
    state = _adapter(worker)
    pid = state["pid"]
    ray.get(worker.configure_adapter.remote(pause_on_update=state["updates"] + 1,
                                            pause_after_tensors=3))
    trainer.optimizer_step(seed=600)
    pending = start_update(stack, manager)
    wait_for(lambda: _adapter(worker)["paused"], 60, "rollout replica 1 to pause mid-update")
    killed_at = kill_pid(pid)
    finished = pending.wait(HANG_S)
    record = settled(lambda: trainer.record()[0], killed_at, FAIL_WITHIN_S)
    survivor = _adapter(workers_of(replicas)[0])
    print(f"rollout pid {pid} killed; manager returned: {finished}; trainer failed "
          f"{_after(record['failed_at'], killed_at)} after the kill: {record['error']}\n"
          f"surviving rollout: {survivor['error']}\nmanager raised: {pending.error!r}")
    assert finished, (f"manager.update_weights still blocked {HANG_S} s after rollout pid "
                      f"{pid} was killed; trainer: {record}")
    assert pending.error is not None, "manager.update_weights succeeded with a rank killed"
    assert record["error"] is not None, (
        f"the trainer's send_weights succeeded though rollout pid {pid} was killed "
        f"mid-update (the manager raised {pending.error!r})")
    took = record["failed_at"] - killed_at
    assert took <= FAIL_WITHIN_S, f"the trainer failed {took:.1f} s after the kill: {record}"
    assert f"pid {pid}" in record["error"], (
        f"the trainer's error does not name the killed rollout's pid {pid}: {record['error']}")

    manager.remove_replicas([victim])
    stack.replicas.remove(victim)
    replacement = stack.new_replicas(1)
    stack.replicas.extend(replacement)
    manager.add_replicas(replacement)
    trainer.optimizer_step(seed=601)
    assert_exact(trainer, stack.replicas, update(stack, manager))


def test_consumer_raises_mid_update(stack):
    """Rollout replica 0's adapter raises after loading 3 tensors of an update (a loader
    bug, an out-of-memory): the trainer's update must fail within 5 s of the raise, naming
    the rollout's pid and the exception; the next update must succeed, exact on every rank.
    Everything observed is reported together."""
    trainer = stack.trainer(1)
    trainer.configure()
    replicas = stack.pool(2)
    manager = stack.manager(trainer, replicas)
    assert_exact(trainer, replicas, update(stack, manager))

    worker = workers_of(replicas)[0]
    state = _adapter(worker)
    pid = state["pid"]
    token = f"injected consumer failure {uuid.uuid4().hex[:8]}"
    ray.get(worker.configure_adapter.remote(fail_on_update=state["updates"] + 1,
                                            fail_after_tensors=3, fail_message=token))
    trainer.optimizer_step(seed=700)
    pending = start_update(stack, manager)
    finished = pending.wait(HANG_S)
    ray.get(worker.configure_adapter.remote())
    raised = _adapter(worker)
    record = settled(lambda: trainer.record()[0], raised["failed_at"] or time.monotonic(),
                     FAIL_WITHIN_S)
    other = _adapter(workers_of(replicas)[1])
    print(f"rollout pid {pid} raised '{token}'; manager returned: {finished}; trainer failed "
          f"{_after(record['failed_at'], raised['failed_at'])} after the raise: "
          f"{record['error']}\nother rollout: {other['error']}\n"
          f"manager raised: {pending.error!r}")
    problems = []
    if not finished:
        problems.append(f"manager.update_weights still blocked {HANG_S} s after the start")
    elif pending.error is None:
        problems.append("manager.update_weights succeeded though a consumer raised")
    if raised["error"] is None or token not in raised["error"]:
        problems.append(f"the adapter did not raise as configured: {raised}")
    if record["error"] is None:
        problems.append("the trainer's send_weights did not fail "
                        f"(the manager raised {pending.error!r})")
    else:
        took = record["failed_at"] - raised["failed_at"]
        if took > FAIL_WITHIN_S:
            problems.append(f"the trainer failed {took:.1f} s after the consumer raised")
        if f"pid {pid}" not in record["error"]:
            problems.append(f"the trainer's error does not name rollout pid {pid}")
        if token not in record["error"]:
            problems.append(f"the trainer's error does not name the exception '{token}'")
    if problems:
        problems.append(f"trainer error: {record['error']}")
        problems.append(f"manager error: {pending.error!r}")
    if finished:
        try:
            trainer.optimizer_step(seed=701)
            assert_exact(trainer, replicas, update(stack, manager))
        except Exception as e:  # reported with the rest
            problems.append(f"the next update failed: {type(e).__name__}: {e}")
    assert not problems, "\n".join(problems)

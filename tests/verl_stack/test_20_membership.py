"""Elastic rollout membership through verl's CheckpointEngineManager.remove_replicas /
add_replicas: the backend rebuilds its sessions around the new set of rollout ranks."""

from __future__ import annotations

import ray

from verl_stack_checks import assert_exact, update, workers_of


def test_remove_then_add_replicas(stack):
    trainer = stack.trainer(1)
    trainer.configure()
    first, second = stack.pool(2)[:2]
    manager = stack.manager(trainer, [first, second])
    trainer.optimizer_step(seed=500)
    assert_exact(trainer, [first, second], update(stack, manager))

    # Scale down: the removed replica takes no part in the next update and keeps its weights.
    manager.remove_replicas([second])
    before = ray.get(workers_of([second])[0].adapter_state.remote())
    trainer.optimizer_step(seed=501)
    step = update(stack, manager)
    assert_exact(trainer, [first], step)
    after = ray.get(workers_of([second])[0].adapter_state.remote())
    assert (after["updates"], after["hash"]) == (before["updates"], before["hash"]), (
        "a removed replica was updated")

    # Scale up: a new replica and the one removed before both join the next update.
    extra = stack.new_replicas(1)
    manager.add_replicas(extra + [second])
    try:
        trainer.optimizer_step(seed=502)
        assert_exact(trainer, [first, second] + extra, update(stack, manager))
    finally:
        for worker in workers_of(extra):  # the pool stays at two replicas
            ray.kill(worker)

"""Updates through verl's real CheckpointEngineManager with ferry's backend, checked byte for
byte: the trainer is verl's FSDP2 TrainingWorker on the CPU (1 and 2 ranks, a real AdamW step
between updates), the rollout ranks verl's CheckpointEngineWorker with the CPU stand-in for
vLLM (conftest.py says what is real)."""

from __future__ import annotations

import pytest
import ray

from verl_stack_checks import assert_exact, trainer_state, update, workers_of


@pytest.mark.parametrize("trainer_world", [1, 2])
def test_updates_are_exact(stack, trainer_world):
    """Three updates to 2 rollout ranks, weights changed by an optimizer step between them;
    after each, every rank holds every trainer tensor byte for byte. The first update of a
    master is staged, the later ones streamed (docs/verl.md): the metrics say which."""
    trainer = stack.trainer(trainer_world)
    trainer.configure()
    replicas = stack.pool(2)
    manager = stack.manager(trainer, replicas)
    hashes, streamed = [], []
    for i in range(3):
        if i:
            trainer.optimizer_step(seed=100 * trainer_world + i)
        step = stack.next_step()
        metrics = manager.update_weights(global_steps=step)
        hashes.append(assert_exact(trainer, replicas, step))
        assert metrics.get("ferry/tensors") == len(ray.get(
            workers_of(replicas)[0].adapter_state.remote())["received"]), metrics
        streamed.append(metrics.get("ferry/streamed"))
    assert len(set(hashes)) == 3, "the optimizer step did not change the trainer's weights"
    assert streamed[1:] == [1.0, 1.0], f"ferry/streamed per update: {streamed}"


def test_trainers_taking_turns(stack):
    """Two trainer worker groups (1 and 2 ranks) update the same rollout ranks in turn: each
    master must serve a new session when the rollout ranks were with the other meanwhile,
    though its own topology did not change (the engine at commit 0cc1ad3 kept its old
    session there, and the rollout ranks timed out joining it)."""
    replicas = stack.pool(2)
    for i, world in enumerate([1, 2, 1, 2]):
        trainer = stack.trainer(world)
        trainer.configure()
        trainer.optimizer_step(seed=200 + i)
        assert_exact(trainer, replicas, update(stack, stack.manager(trainer, replicas)))


def test_generator_reusing_one_buffer(stack):
    """The trainer yields every tensor as a view of one buffer it refills for the next
    (as a trainer staging each tensor in one bucket): the engine must take each tensor's
    bytes before it pulls the next, in staged and streamed updates alike."""
    trainer = stack.trainer(2)
    replicas = stack.pool(2)
    manager = stack.manager(trainer, replicas)
    trainer.configure(reuse_buffer=True)
    reused = [r["reused"] for r in trainer.record()]
    try:
        for i in range(3):
            trainer.optimizer_step(seed=300 + i)
            assert_exact(trainer, replicas, update(stack, manager))
    finally:
        trainer.configure()
    tensors = len(trainer_state(trainer))
    assert [r["reused"] for r in trainer.record()] == [n + 3 * tensors for n in reused]


def test_consumer_writing_into_what_it_is_given(stack):
    """Rollout rank 0 overwrites every tensor it is handed after loading it (scratch use of
    its input). Rank 1, reading the same update, must still get the trainer's bytes, and
    so must both ranks in the next updates."""
    trainer = stack.trainer(1)
    replicas = stack.pool(2)
    manager = stack.manager(trainer, replicas)
    writer = workers_of(replicas)[0]
    ray.get(writer.configure_adapter.remote(write_into_received=True))
    written = ray.get(writer.adapter_state.remote())["written"]
    try:
        for i in range(2):
            trainer.optimizer_step(seed=400 + i)
            assert_exact(trainer, replicas, update(stack, manager))
    finally:
        ray.get(writer.configure_adapter.remote())
    tensors = len(trainer_state(trainer))
    assert ray.get(writer.adapter_state.remote())["written"] == written + 2 * tensors
    trainer.optimizer_step(seed=402)
    assert_exact(trainer, replicas, update(stack, manager))

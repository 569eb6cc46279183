"""Lifecycle, iteration, cancellation and control of the async in-process Collector."""

from __future__ import annotations

import threading

import anyio
import pytest
import torch

from aiocollect import Collector, CollectorClosedError, PolicyOutputError
from aiocollect.testing import CountingEnv, FailingEnv, ScriptedPolicy

pytestmark = pytest.mark.anyio


def counting(num_envs: int = 2, length: int = 5) -> CountingEnv:
    return CountingEnv(num_envs, episode_length=length)


@pytest.mark.all_backends
async def test_async_with_yields_budget_and_closes_env() -> None:
    env = counting()
    async with Collector(lambda: env, frames_per_batch=8, total_frames=24) as c:
        shapes = [b.shape async for b in c]
        assert c.stats().frames == 24
    assert shapes == [torch.Size([2, 4])] * 3
    assert env.closed


@pytest.mark.all_backends
async def test_iteration_without_async_with_closes_when_exhausted() -> None:
    env = counting()
    c = Collector(lambda: env, frames_per_batch=4, total_frames=8)
    batches = [b async for b in c]
    assert len(batches) == 2
    assert env.closed
    with pytest.raises(CollectorClosedError):
        async with c:
            pass


async def test_aclose_without_iteration_is_idempotent() -> None:
    env = counting()
    c = Collector(lambda: env, frames_per_batch=4, total_frames=8)
    assert await c.__anext__() is not None
    await c.aclose()
    await c.aclose()
    assert env.closed


async def test_batch_layout_and_names() -> None:
    async with Collector(lambda: counting(3), frames_per_batch=10, total_frames=20) as c:
        batch = await c.__anext__()
    assert batch.shape == (3, 4)
    assert batch.names == [None, "time"]
    assert batch["next", "reward"].shape == (3, 4, 1) and batch["next", "reward"].dtype == torch.float32
    for key in ("done", "terminated", "truncated"):
        assert batch["next", key].dtype == torch.bool and batch["next", key].shape == (3, 4, 1)
        assert not batch[key].any()
    assert batch["collector", "traj_ids"].dtype == torch.int64
    assert (batch["collector", "worker_id"] == 0).all()
    assert (batch["collector", "policy_version"] == 0).all()


async def test_break_stops_within_a_step_and_leaves_no_thread() -> None:
    env = counting(1, length=1000)
    before = threading.active_count()
    with anyio.fail_after(10):
        async with Collector(lambda: env, frames_per_batch=10_000, max_queued_batches=2) as c:
            async for _ in c:
                break
    assert env.closed
    assert threading.active_count() <= before + 1  # anyio's idle worker at most


async def test_exception_in_body_propagates_and_closes() -> None:
    env = counting()
    with pytest.raises(KeyError, match="boom"):
        async with Collector(lambda: env, frames_per_batch=4) as c:
            async for _ in c:
                raise KeyError("boom")
    assert env.closed


async def test_cancelling_consumer_stops_collection() -> None:
    env = counting(1, length=10**9)
    started = anyio.Event()

    async def consume() -> None:
        async with Collector(lambda: env, frames_per_batch=10**6) as c:
            started.set()
            await c.__anext__()  # one huge batch: cancelled mid-rollout

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await started.wait()
            tg.cancel_scope.cancel()
    assert env.closed


async def test_env_error_reaches_consumer_with_original_traceback() -> None:
    with pytest.raises(ValueError, match="FailingEnv failed at step 3") as info:
        async with Collector(lambda: FailingEnv(fail_at=3), frames_per_batch=10) as c:
            await c.__anext__()
    frames = [f.name for f in info.traceback]
    assert "step" in frames  # the env's own frame is in the traceback


async def test_env_error_in_lazy_mode_closes() -> None:
    c = Collector(lambda: FailingEnv(fail_at=2), frames_per_batch=10)
    with pytest.raises(ValueError):
        await c.__anext__()
    with pytest.raises(CollectorClosedError):
        await c.__anext__()


async def test_wrong_policy_output_names_expected_and_actual() -> None:
    bad = torch.nn.Linear(3, 2)  # float [B, 2] instead of an int64 index
    c = Collector(lambda: counting(), bad, frames_per_batch=4)
    with pytest.raises(PolicyOutputError, match=r"must have shape \(2,\) .* got \(2, 2\)"):
        await c.__anext__()


async def test_max_queued_batches_zero_collects_on_demand() -> None:
    policy = ScriptedPolicy(1.0)
    async with Collector(lambda: counting(), policy, frames_per_batch=4) as c:
        first = await c.__anext__()
        await c.update_policy_weights_(ScriptedPolicy(-1.0))
        second = await c.__anext__()
    # No batch was collected ahead: the second one used only the new weights.
    assert (first["collector", "policy_version"] == 0).all()
    assert (second["collector", "policy_version"] == 1).all()
    assert policy.weight.item() == -1.0


async def test_update_policy_weights_accepts_state_dict() -> None:
    policy = ScriptedPolicy(1.0)
    c = Collector(lambda: counting(), policy, frames_per_batch=4)
    try:
        await c.__anext__()
        await c.update_policy_weights_(weights={"weight": torch.tensor(-2.0)})
        batch = await c.__anext__()
    finally:
        await c.aclose()
    assert policy.weight.item() == -2.0
    assert c.stats().policy_version == 1
    assert (batch["collector", "policy_version"] == 1).all()


async def test_state_dict_round_trip_keeps_counters_and_fresh_ids() -> None:
    c = Collector(lambda: counting(), frames_per_batch=4, total_frames=40)
    try:
        b = await c.__anext__()
        sd = c.state_dict()
    finally:
        await c.aclose()
    c2 = Collector(lambda: counting(), frames_per_batch=4, total_frames=40)
    c2.load_state_dict(sd)
    try:
        b2 = await c2.__anext__()
    finally:
        await c2.aclose()
    assert c2.stats().frames == 8
    assert b2["collector", "traj_ids"].min() > b["collector", "traj_ids"].max()


async def test_len_and_repr() -> None:
    with pytest.warns(UserWarning, match="not divisible"):
        c = Collector(lambda: counting(), frames_per_batch=4, total_frames=10)
    assert len(c) == 3
    assert "not started" in repr(c) and "frames: 0/10" in repr(c)
    with pytest.raises(TypeError, match="endless"):
        len(Collector(lambda: counting(), frames_per_batch=4))


async def test_an_env_that_fails_to_close_is_raised_unless_the_body_raised_first() -> None:
    with anyio.fail_after(30):
        with pytest.raises(ValueError, match=r"^FailingEnv failed to close$"):
            async with Collector(FailingEnv(1, fail_at=None, fail_on_close=True), frames_per_batch=4) as c:
                await c.__anext__()
        with pytest.raises(KeyError, match="the loop body's own error") as info:
            async with Collector(FailingEnv(1, fail_at=None, fail_on_close=True), frames_per_batch=4) as c:
                await c.__anext__()
                raise KeyError("the loop body's own error")
    assert info.value.__notes__ == ["closing the collector also failed: ValueError: FailingEnv failed to close"]

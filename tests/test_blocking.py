"""The blocking twins: same scenarios through the portal, plus the in-loop misuse rule."""

from __future__ import annotations

import pytest
import torch

import aiocollect
from aiocollect import SyncDataCollector, blocking
from aiocollect.testing import CountingEnv, FailingEnv, ScriptedPolicy


def test_classic_name_is_the_blocking_twin() -> None:
    assert SyncDataCollector is blocking.Collector
    assert issubclass(blocking.Collector, aiocollect.DataCollectorBase)


def test_with_block_iterates_budget_and_stops_portal_thread() -> None:
    env = CountingEnv(2)
    with SyncDataCollector(lambda: env, frames_per_batch=8, total_frames=24) as c:
        shapes = [b.shape for b in c]
        assert c.stats().frames == 24
    assert shapes == [torch.Size([2, 4])] * 3
    assert env.closed
    # The autouse no_leaks fixture then checks that the portal thread and its workers exit.


def test_plain_iteration_and_next_returns_none_when_spent() -> None:
    env = CountingEnv(1)
    c = SyncDataCollector(lambda: env, frames_per_batch=4, total_frames=8)
    assert c.next() is not None
    assert c.next() is not None
    assert c.next() is None
    assert env.closed
    c.shutdown()  # idempotent


def test_break_then_shutdown_closes_env() -> None:
    env = CountingEnv(1)
    c = SyncDataCollector(lambda: env, frames_per_batch=4)
    for _ in c:
        break
    c.shutdown()
    assert env.closed


def test_env_error_is_raised_with_original_type() -> None:
    with pytest.raises(ValueError, match="failed at step 2"):
        with SyncDataCollector(lambda: FailingEnv(fail_at=2), frames_per_batch=4) as c:
            next(iter(c))


def test_update_weights_set_seed_and_state_dict_through_portal() -> None:
    policy = ScriptedPolicy(1.0)
    with SyncDataCollector(lambda: CountingEnv(2), policy, frames_per_batch=4, total_frames=8) as c:
        c.set_seed(3)
        first = next(c)
        c.update_policy_weights_(weights={"weight": torch.tensor(-1.0)})
        second = next(c)
        sd = c.state_dict()
    assert (first["collector", "policy_version"] == 0).all()
    assert (second["collector", "policy_version"] == 1).all()
    assert sd["frames"] == 8 and sd["policy_version"] == 1


def test_repr_names_blocking_class() -> None:
    c = SyncDataCollector(lambda: CountingEnv(1), frames_per_batch=4, total_frames=8)
    try:
        assert repr(c).startswith("<blocking.Collector [open")  # built by the constructor, as TorchRL's
    finally:
        c.shutdown()
    assert repr(c).startswith("<blocking.Collector [closed")


@pytest.mark.anyio
async def test_blocking_call_inside_event_loop_names_async_class() -> None:
    # The constructor builds the env through the portal (as TorchRL's builds it): refused there.
    with pytest.raises(
        RuntimeError,
        match=r"^aiocollect\.blocking\.Collector cannot be used inside a running "
        r"event loop; use aiocollect\.Collector with 'async with' instead$",
    ):
        SyncDataCollector(lambda: CountingEnv(1), frames_per_batch=4)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("end", ["total_frames", "shutdown"])
def test_a_blocking_twin_raises_a_workers_env_close_failure_where_it_closes(end: str) -> None:
    from functools import partial

    fails = partial(FailingEnv, 1, None, fail_on_close=True)
    total = 16 if end == "total_frames" else -1
    c = aiocollect.MultiSyncDataCollector([fails, fails], frames_per_batch=8, total_frames=total)
    batches = []
    expected = r"^worker 0 \(pid \d+\) failed: ValueError: FailingEnv failed to close"
    with pytest.raises(aiocollect.WorkerError, match=expected):
        for b in c:  # the last batch's next() closes the collector when total_frames is reached
            batches.append(b)
            if len(batches) == 2 and end == "shutdown":
                c.shutdown()
    assert len(batches) == 2
    c.shutdown()  # closed all the same: a second call does nothing

"""Liveness of worker processes: a stopped or hung worker is named, never waited on forever."""

from __future__ import annotations

import os
import signal
from typing import Any

import anyio
import pytest

from aiocollect import MultiAsyncCollector, MultiSyncCollector, WorkerError, WorkerTimeoutError
from aiocollect.testing import CountingEnv, HangingEnv

pytestmark = [pytest.mark.timeout(120), pytest.mark.anyio]


def healthy() -> CountingEnv:
    return CountingEnv(1, episode_length=1000)


def hangs_at_third_step() -> HangingEnv:
    return HangingEnv(1, hang_at=3)


async def stall_error(collector: Any) -> WorkerTimeoutError:
    """Iterate ``collector`` until it raises; return the WorkerTimeoutError."""
    with anyio.fail_after(30), pytest.raises(WorkerTimeoutError) as info:
        async for _ in collector:
            pass
    return info.value


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_a_worker_blocked_in_step_is_named_by_worker_timeout(cls: Any) -> None:
    async with cls([healthy, hangs_at_third_step], frames_per_batch=4, worker_timeout=1.0,
                   shutdown_timeout=1.0) as c:  # fmt: skip
        err = await stall_error(c)
    assert isinstance(err, WorkerError)  # one `except WorkerError` catches every worker failure
    assert err.worker_id == 1 and err.pid is not None and err.step is not None
    assert str(err).startswith(f"worker 1 (pid {err.pid}) made no progress for ")
    assert "(worker_timeout=1) after step" in str(err)
    assert "blocked in its env or policy" in str(err)
    assert err.seconds >= 1.0


async def test_a_stopped_worker_is_reported_by_stats_then_raised() -> None:
    async with MultiAsyncCollector([healthy, healthy], frames_per_batch=2000, worker_timeout=2.0,
                                   shutdown_timeout=1.0) as c:  # fmt: skip
        with anyio.fail_after(30):
            await c.__anext__()
        stopped = c._worker_pids()[1]
        assert c.stats().stalled_workers == ()
        os.kill(stopped, signal.SIGSTOP)
        errors: list[WorkerTimeoutError] = []

        async def consume() -> None:
            errors.append(await stall_error(c))

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)  # keeps asking both workers for batches
                # stats() lists it once it owes work and half of worker_timeout has passed.
                with anyio.fail_after(30):
                    # Polled: stats() is a snapshot, and nothing signals when it changes.
                    while c.stats().stalled_workers != (1,):  # noqa: ASYNC110
                        await anyio.sleep(0.05)
                assert c.stats().workers_alive == 2  # alive, but stalled
        finally:
            os.kill(stopped, signal.SIGCONT)
    (err,) = errors
    assert err.worker_id == 1 and err.pid == stopped
    assert "its process is stopped (SIGSTOP or a debugger)" in str(err)


async def test_a_stopped_multisync_worker_is_restarted_under_restart_workers() -> None:
    async with MultiSyncCollector([healthy, healthy], frames_per_batch=8, worker_timeout=1.0,
                                  restart_workers=1, shutdown_timeout=1.0) as c:  # fmt: skip
        with anyio.fail_after(60):
            await c.__anext__()
            stopped = c._worker_pids()[0]
            os.kill(stopped, signal.SIGSTOP)
            batch = await c.__anext__()  # worker 0 is killed and replaced, then delivers
        assert batch.shape == (2, 1, 4)  # [workers, envs, time]
        assert c._worker_pids()[0] != stopped
        assert c.stats().restarts == 1 and c.stats().stalled_workers == ()


async def test_idle_workers_are_not_stalled() -> None:
    # Workers wait (without stepping) while the trainer holds a batch for longer than
    # worker_timeout: they have no work, so nothing times out.
    async with MultiSyncCollector([healthy, healthy], frames_per_batch=8, worker_timeout=0.5) as c:
        with anyio.fail_after(30):
            await c.__anext__()
            await anyio.sleep(1.0)  # the trainer "trains" past worker_timeout
            await c.__anext__()
        assert c.stats().stalled_workers == ()


def test_worker_timeout_is_validated_before_anything_starts() -> None:
    with pytest.raises(ValueError, match=r"^worker_timeout must be a positive number of seconds or None, got 0$"):
        MultiSyncCollector(healthy, num_workers=2, frames_per_batch=8, worker_timeout=0)
    with pytest.raises(TypeError, match=r"^worker_timeout must be a positive number of seconds or None, got '5'$"):
        MultiAsyncCollector(healthy, num_workers=2, frames_per_batch=8, worker_timeout="5")


# -- one rule for several failures -----------------------------------------------------------------


def fails_at_first_step() -> Any:
    from aiocollect.testing import FailingEnv

    return FailingEnv(1, fail_at=1)


def fails_to_build() -> Any:
    raise RuntimeError("this env cannot be built")


@pytest.mark.parametrize("factory", [fails_at_first_step, fails_to_build])
async def test_the_same_bug_in_every_worker_raises_one_worker_error(factory: Any) -> None:
    # Whether one or both failures have arrived when the error is raised depends on timing;
    # the type does not: always a WorkerError (never an ExceptionGroup), the lowest id first.
    with anyio.fail_after(60), pytest.raises(WorkerError) as info:
        async with MultiSyncCollector(factory, num_workers=2, frames_per_batch=4) as c:
            async for _ in c:
                pass
    err = info.value
    # A start-up failure is also the original exception's built-in type (TorchRL re-raises it so).
    expected = WorkerError if factory is fails_at_first_step else type(err)
    assert type(err) is expected and issubclass(expected, WorkerError)
    if factory is fails_to_build:
        assert isinstance(err, RuntimeError) and type(err).__name__ == "WorkerError[RuntimeError]"
    assert all(type(o) is expected for o in err.others)
    ids = [err.worker_id, *(o.worker_id for o in err.others)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    if err.others:
        assert "other workers failed too:" in err.__notes__[0]


def test_first_failure_orders_by_worker_and_attaches_the_rest() -> None:
    from aiocollect import WorkerCrashedError
    from aiocollect._core._errors import first_failure

    crash, raised = WorkerCrashedError(2, 20, -9), WorkerError(1, 10, 5, "ValueError: boom")
    err = first_failure([crash, raised])
    assert err is raised and err.others == (crash,)
    assert err.__notes__ == ["other workers failed too:\n  WorkerCrashedError: worker 2 (pid 20) killed by SIGKILL"]
    assert first_failure([crash]) is crash and crash.others == ()

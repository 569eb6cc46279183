"""Multi-process collectors over real spawned workers (each test checks for leftovers)."""

from __future__ import annotations

import os
import signal
from functools import partial
from pathlib import Path

import anyio
import pytest
import torch
from _rendezvous import MeetingCountingEnv, met

from aiocollect import (
    AsyncCollector,
    MultiAsyncCollector,
    MultiSyncCollector,
    WorkerCrashedError,
    WorkerError,
)
from aiocollect._workers._loop import SLOTS
from aiocollect.testing import CountingEnv, FailingEnv, ScriptedPolicy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def counting_env() -> CountingEnv:
    return CountingEnv(2, episode_length=3)


async def test_multisync_stacks_workers_in_order(backend: str) -> None:
    with anyio.fail_after(60):
        async with MultiSyncCollector(
            counting_env, num_workers=2, frames_per_batch=16, total_frames=32, backend=backend
        ) as c:
            batches = [b async for b in c]
    assert [b.shape for b in batches] == [torch.Size([2, 2, 4])] * 2
    assert batches[0].names == [None, None, "time"]
    for b in batches:
        assert torch.equal(b["collector", "worker_id"][:, 0, 0], torch.tensor([0, 1]))
        # Real transitions: next step index = step index + 1 on every frame.
        assert torch.equal(b["next", "observation"][..., 2], b["observation"][..., 2] + 1)
    ids = torch.cat([b["collector", "traj_ids"].flatten() for b in batches])
    w = torch.cat([b["collector", "worker_id"].flatten() for b in batches])
    for traj in ids.unique():
        assert w[ids == traj].unique().numel() == 1  # an id never spans two workers


@pytest.mark.parametrize(("cat", "shape"), [(0, (4, 4)), (-1, (2, 8))])
async def test_multisync_cat_results(cat: int, shape: tuple[int, int], backend: str) -> None:
    with anyio.fail_after(60):
        async with MultiSyncCollector(counting_env, num_workers=2, frames_per_batch=16, total_frames=16,
                                      cat_results=cat, backend=backend) as c:  # fmt: skip
            (batch,) = [b async for b in c]
    assert batch.shape == shape
    assert batch.names[-1] == "time"


async def test_multiasync_delivers_whole_worker_batches_first_come(backend: str, tmp_path: Path) -> None:
    # The workers meet at the first step of their second batch (4 steps of 2 envs each):
    # neither can deliver a second batch before the other has delivered its first.
    meeting = partial(MeetingCountingEnv, str(tmp_path), 2, 5, num_envs=2, episode_length=3)
    with anyio.fail_after(60):
        async with MultiAsyncCollector(
            meeting, num_workers=2, frames_per_batch=8, total_frames=64, backend=backend
        ) as c:
            batches = [b async for b in c]
            assert c.stats().workers_alive == 2
    assert all(b.shape == (2, 4) for b in batches) and len(batches) == 8
    assert met(tmp_path) == 2  # both workers met
    workers = {int(b["collector", "worker_id"][0, 0]) for b in batches}
    assert workers == {0, 1}
    for b in batches:
        assert b["collector", "worker_id"].unique().numel() == 1


async def test_async_collector_single_background_worker(backend: str) -> None:
    with anyio.fail_after(60):
        async with AsyncCollector(counting_env, frames_per_batch=8, total_frames=24, backend=backend) as c:
            batches = [b async for b in c]
    assert len(batches) == 3 and all((b["collector", "worker_id"] == 0).all() for b in batches)


async def test_same_seed_same_data_whatever_the_timing(backend: str) -> None:
    async def run(seed: int) -> list[torch.Tensor]:
        async with MultiSyncCollector(
            "CartPole-v1", num_workers=2, frames_per_batch=64, total_frames=128, backend=backend
        ) as c:
            c.set_seed(seed)
            return [torch.cat([b["observation"].flatten(), b["action"].float().flatten()]) async for b in c]

    with anyio.fail_after(90):
        a, b = await run(7), await run(7)
        other = await run(8)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], other[0])


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_weight_update_reaches_every_worker_at_a_batch_boundary(cls: type, backend: str) -> None:
    policy = ScriptedPolicy(1.0)
    stale: dict[int, int] = {0: 0, 1: 0}  # old-version batches each worker delivered after the update
    seen_new: set[int] = set()
    with anyio.fail_after(90):
        async with cls(counting_env, policy, num_workers=2, frames_per_batch=8, backend=backend) as c:
            first = await c.__anext__()
            assert (first["collector", "policy_version"] == 0).all()
            assert torch.equal(first["action"], policy(first["observation"]))
            new = ScriptedPolicy(-1.0)
            await c.update_policy_weights_(new)
            # Until both workers have delivered a new batch, however unevenly a loaded machine
            # schedules them (an async collector takes whichever worker is ready).
            while seen_new != {0, 1}:
                batch = await c.__anext__()
                versions = batch["collector", "policy_version"].unique()
                assert versions.numel() == 1  # no batch mixes two versions
                workers = set(batch["collector", "worker_id"].unique().tolist())  # both, in a sync batch
                if int(versions) == 1:
                    assert torch.equal(batch["action"], new(batch["observation"]))
                    seen_new |= workers
                else:
                    assert not workers & seen_new, "a worker went back to the old weights"
                    for w in workers:
                        stale[w] += 1
                if cls is MultiSyncCollector:
                    assert int(versions) == 1  # sync workers were idle: the very next batch is new
    # At a batch boundary: only the batches each worker was asked for before the update (one
    # per slot, at most) can be old.
    assert max(stale.values()) <= SLOTS, stale


async def test_env_error_in_worker_raises_worker_error_with_traceback(backend: str) -> None:
    def failing() -> FailingEnv:
        return FailingEnv(1, fail_at=5)

    with anyio.fail_after(60):
        # Both workers fail at the same step: one WorkerError (never an exception group, which
        # an `except WorkerError` would miss), the lowest worker id's when both reports arrive
        # together, the other then attached to it.
        with pytest.raises(WorkerError) as info:
            async with MultiSyncCollector(failing, num_workers=2, frames_per_batch=100, backend=backend) as c:
                await c.__anext__()
    err = info.value
    assert all(isinstance(e, WorkerError) for e in err.others)
    assert err.worker_id in (0, 1) and err.pid is not None
    assert (err.pid == os.getpid()) == (backend == "inline")  # a thread here, or a worker process
    assert "FailingEnv failed at step 5" in str(err)
    assert isinstance(err.__cause__, ValueError)
    assert "testing.py" in str(err.__cause__.__cause__)  # the worker's own traceback


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_an_env_that_fails_to_close_is_raised_from_the_close_with_its_worker(backend: str, cls: type) -> None:
    # As the in-process Collector raises its env's close() error: a worker's is not only printed.
    def fails_to_close(w: int) -> FailingEnv:
        return FailingEnv(1, fail_at=None, fail_on_close=w == 1)

    with anyio.fail_after(60), pytest.raises(WorkerError) as info:
        async with cls([partial(fails_to_close, 0), partial(fails_to_close, 1)], frames_per_batch=8,
                       total_frames=16, backend=backend) as c:  # fmt: skip
            assert len([b async for b in c]) == 2
    err = info.value
    assert err.worker_id == 1 and err.pid is not None
    assert "FailingEnv failed to close" in str(err)
    assert isinstance(err.__cause__, ValueError)
    assert "in close" in str(err.__cause__.__cause__)  # the worker's own traceback


async def test_a_close_failure_never_replaces_the_bodys_exception_or_a_cancellation(backend: str) -> None:
    def fails_to_close() -> FailingEnv:
        return FailingEnv(1, fail_at=None, fail_on_close=True)

    with anyio.fail_after(60):
        with pytest.raises(KeyError, match="the loop body's own error") as info:
            async with MultiSyncCollector([fails_to_close], frames_per_batch=8, backend=backend) as c:
                await c.__anext__()
                raise KeyError("the loop body's own error")
        assert any("closing the collector also failed" in n and "failed to close" in n for n in info.value.__notes__)
        with anyio.CancelScope() as scope:
            async with MultiSyncCollector([fails_to_close], frames_per_batch=8, backend=backend) as c:
                await c.__anext__()
                scope.cancel()
                await anyio.lowlevel.checkpoint()
        assert scope.cancelled_caught  # the cancellation reached its scope, not a WorkerError instead


async def test_a_worker_that_failed_reports_that_failure_not_its_close(backend: str) -> None:
    def fails_twice() -> FailingEnv:
        return FailingEnv(1, fail_at=3, fail_on_close=True)

    with anyio.fail_after(60), pytest.raises(WorkerError, match="FailingEnv failed at step 3") as info:
        async with MultiSyncCollector([fails_twice], frames_per_batch=8, backend=backend) as c:
            await c.__anext__()
    assert "failed to close" not in str(info.value)


async def test_env_construction_error_is_reported_at_start(backend: str) -> None:
    def broken() -> None:
        raise OSError("simulator licence not found")

    with anyio.fail_after(60):
        with pytest.raises(WorkerError) as info:
            async with AsyncCollector(broken, frames_per_batch=8, backend=backend):
                pass
    assert info.value.worker_id == 0
    assert "simulator licence not found" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


async def test_sigkill_gives_worker_crashed_error() -> None:
    def env() -> CountingEnv:
        return CountingEnv(0, episode_length=10**9)

    with anyio.fail_after(60):
        with pytest.raises(WorkerCrashedError) as info:
            async with MultiAsyncCollector(env, num_workers=2, frames_per_batch=1000) as c:
                batch = await c.__anext__()
                pid = c._worker_pids()[int(batch["collector", "worker_id"][0])]
                os.kill(pid, signal.SIGKILL)
                while True:
                    await c.__anext__()
    assert info.value.exitcode == -signal.SIGKILL and "SIGKILL" in str(info.value)


async def test_supervised_worker_is_restarted_and_iteration_continues() -> None:
    def env() -> CountingEnv:
        return CountingEnv(0, episode_length=10**9)

    with anyio.fail_after(90):
        async with MultiSyncCollector(env, ScriptedPolicy(1.0), num_workers=2, frames_per_batch=200,
                                      restart_workers=1) as c:  # fmt: skip
            await c.__anext__()
            await c.update_policy_weights_(ScriptedPolicy(-1.0))
            os.kill(c._worker_pids()[1], signal.SIGKILL)
            batch = await c.__anext__()
            stats = c.stats()
    assert stats.restarts == 1 and stats.dropped_batches == 1 and stats.workers_alive == 2
    assert batch.shape == (2, 100)
    # The restarted worker came back with the current weights and version.
    assert (batch["collector", "policy_version"] == 1).all()


async def test_break_stops_all_workers(backend: str) -> None:
    with anyio.fail_after(60):
        async with MultiAsyncCollector(counting_env, num_workers=2, frames_per_batch=8, backend=backend) as c:
            async for _ in c:
                break
        assert c.stats().workers_alive == 2  # stats survive; the no_leaks fixture checks the processes


async def test_fds_do_not_grow_with_batches(backend: str) -> None:
    with anyio.fail_after(60):
        async with MultiAsyncCollector(counting_env, num_workers=2, frames_per_batch=8, backend=backend) as c:
            for _ in range(5):
                await c.__anext__()
            before = len(os.listdir("/proc/self/fd"))
            for _ in range(100):
                await c.__anext__()
            after = len(os.listdir("/proc/self/fd"))
    assert after <= before


def test_bad_arguments_fail_before_spawning() -> None:
    with pytest.raises(ValueError, match=r"^num_workers must be a positive int"):
        MultiSyncCollector(counting_env, num_workers=0, frames_per_batch=8)
    with pytest.raises(
        ValueError,
        match=(
            r"^If `frames_per_batch` is provided as a sequence, it should contain exactly one value per worker: "
            r"got 3 values for 2 workers; give one per worker$"
        ),
    ):
        MultiSyncCollector(counting_env, num_workers=2, frames_per_batch=[1, 2, 3])
    with pytest.raises(ValueError, match=r"^cat_results is only for MultiSyncCollector"):
        MultiAsyncCollector(counting_env, num_workers=2, frames_per_batch=8, cat_results=0)
    with pytest.raises(ValueError, match=r"^frames_per_batch must be a positive int, got 0$"):
        MultiSyncCollector(counting_env, num_workers=2, frames_per_batch=0)
    with pytest.raises(TypeError, match=r"^AsyncCollector runs exactly one worker"):
        AsyncCollector(counting_env, num_workers=2, frames_per_batch=8)
    with pytest.raises(
        LookupError, match=r"^unknown worker backend 'mpi'; choose one of: distributed, inline, ray, rpc, subprocess$"
    ):
        MultiSyncCollector(counting_env, num_workers=2, frames_per_batch=8, backend="mpi")

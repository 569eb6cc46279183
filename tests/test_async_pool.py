"""AsyncEnvPool at scale: failures named or turned into truncations, timeouts, bounded concurrency.

Every test runs under asyncio, asyncio with uvloop and trio (the pool's fast path is
asyncio's; trio takes the generic one).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
import torch
from _rendezvous import MeetingSleepyEnv, met
from gymnasium import spaces

from aiocollect import (
    AsyncEnvPool,
    Collector,
    EnvTimeoutError,
    MultiaSyncDataCollector,
    MultiSyncDataCollector,
    aSyncDataCollector,
)
from aiocollect._envs._gcfreeze import _INTERPRETER_FROZEN
from aiocollect.testing import SleepyAsyncEnv

pytestmark = pytest.mark.timeout(60)


class Scripted:
    """Counts its steps; misbehaves once, at step ``at``: raises, or hangs until cancelled."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, at: int | None = None, how: str = "raise", episode_length: int = 50) -> None:
        self.at, self.how, self.episode_length = at, how, episode_length
        self.t = self.steps = 0

    async def reset(self, *, seed: int | None = None) -> tuple[Any, dict]:
        self.t = 0
        return np.zeros(1, np.float32), {}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.steps += 1
        await anyio.lowlevel.checkpoint()
        if self.steps == self.at:
            if self.how == "raise":
                raise ValueError(f"simulator lost at step {self.steps}")
            await anyio.sleep_forever()
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= self.episode_length, False, {}


@pytest.mark.anyio
@pytest.mark.all_backends
async def collect(pool: Any, frames: int) -> tuple[list[Any], Any]:
    async with Collector(lambda: pool, frames_per_batch=frames, total_frames=frames) as c:
        batches = [b async for b in c]
        return batches, c.stats()


@pytest.mark.anyio
@pytest.mark.all_backends
async def test_a_failing_env_is_raised_as_itself_naming_the_env() -> None:
    pool = AsyncEnvPool([Scripted(at=3 if i == 5 else None) for i in range(8)])
    note = r"\nraised by AsyncEnvPool env 5 in step\(\)$"  # pytest matches the notes too
    with anyio.fail_after(20), pytest.raises(ValueError, match=r"^simulator lost at step 3" + note) as info:
        await collect(pool, 80)
    assert info.value.__notes__ == ["raised by AsyncEnvPool env 5 in step()"]


@pytest.mark.anyio
@pytest.mark.all_backends
async def test_on_error_reset_records_a_truncation_resets_the_env_and_counts_it() -> None:
    pool = AsyncEnvPool([Scripted(at=3 if i == 1 else None) for i in range(4)], on_error="reset")
    with anyio.fail_after(20):
        (batch,), stats = await collect(pool, 24)
    row = batch[1]
    # Steps 1 and 2 ran; step 3 failed: recorded as a truncation that keeps the last observation.
    assert row["next", "observation"][:4, 0].tolist() == [1.0, 2.0, 2.0, 1.0]
    assert row["next", "truncated"][:, 0].tolist() == [False, False, True, False, False, False]
    assert row["next", "reward"][:3, 0].tolist() == [1.0, 1.0, 0.0]
    assert row["observation"][3, 0].item() == 0.0  # the env was reset
    ids = row["collector", "traj_ids"]
    assert ids[2] == ids[0] and ids[3] != ids[2]
    assert not batch[[0, 2, 3]]["next", "truncated"].any()
    assert (stats.env_errors, stats.env_timeouts) == (1, 0)
    assert pool.counters.errors == 1


@pytest.mark.anyio
@pytest.mark.all_backends
async def test_a_step_past_step_timeout_is_an_error_naming_the_env() -> None:
    pool = AsyncEnvPool([Scripted(at=2 if i == 3 else None, how="hang") for i in range(4)], step_timeout=0.2)
    with anyio.fail_after(20), pytest.raises(EnvTimeoutError, match=r"^AsyncEnvPool env 3 \(Scripted\) did not finish"):
        await collect(pool, 40)


@pytest.mark.anyio
@pytest.mark.all_backends
async def test_on_timeout_truncate_ends_only_that_envs_episode() -> None:
    pool = AsyncEnvPool([Scripted(at=2 if i == 0 else None, how="hang") for i in range(3)], step_timeout=0.2,
                        on_timeout="truncate")  # fmt: skip
    with anyio.fail_after(20):
        (batch,), stats = await collect(pool, 12)
    assert batch[0]["next", "truncated"][:, 0].tolist() == [False, True, False, False]
    assert batch[0]["next", "observation"][:3, 0].tolist() == [1.0, 1.0, 1.0]
    assert (stats.env_errors, stats.env_timeouts) == (0, 1)
    assert batch[1]["next", "observation"][:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]


class Counted(SleepyAsyncEnv):
    """Records how many of its siblings' steps are in flight at once."""

    def __init__(self, shared: dict[str, int]) -> None:
        super().__init__(delay=0.002)
        self.shared = shared

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.shared["now"] += 1
        self.shared["peak"] = max(self.shared["peak"], self.shared["now"])
        try:
            return await super().step(action)
        finally:
            self.shared["now"] -= 1


@pytest.mark.anyio
@pytest.mark.all_backends
@pytest.mark.parametrize("limit", [1, 4, None])
async def test_max_concurrency_bounds_steps_in_flight(limit: int | None) -> None:
    shared = {"now": 0, "peak": 0}
    pool = AsyncEnvPool([Counted(shared) for _ in range(16)], max_concurrency=limit)
    with anyio.fail_after(20):
        (batch,), _ = await collect(pool, 64)
    assert shared["peak"] == (16 if limit is None else limit)
    assert batch["next", "observation"][:, -1, 0].tolist() == [4.0] * 16  # every step taken


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_concurrency": 0}, r"^max_concurrency must be"),
        ({"step_timeout": 0}, r"^step_timeout must be a positive number of seconds or None, got 0$"),
        ({"on_timeout": "skip"}, r"^on_timeout must be 'error' or 'truncate', got 'skip'$"),
        ({"on_error": "ignore"}, r"^on_error must be 'raise' or 'reset', got 'ignore'$"),
    ],
)
def test_bad_pool_arguments_fail_at_once(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AsyncEnvPool([SleepyAsyncEnv()], **kwargs)


def pool_of_sleepy() -> AsyncEnvPool:
    return AsyncEnvPool([SleepyAsyncEnv(delay=0.001, episode_length=5) for _ in range(8)])


def pool_that_meets(directory: str) -> AsyncEnvPool:
    """Both workers' 16 envs meet at the first step of the second 80-frame batch (10 steps each)."""
    return AsyncEnvPool([MeetingSleepyEnv(directory, 16, 11) for _ in range(8)])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["MultiSync", "MultiaSync", "aSync"])
def test_coroutine_envs_in_worker_processes_run_on_each_workers_loop(kind: str, tmp_path: Path) -> None:
    if kind == "MultiSync":
        collector = MultiSyncDataCollector([pool_of_sleepy] * 2, None, frames_per_batch=160, total_frames=480)
    elif kind == "MultiaSync":
        # First come, first served: without the meeting one worker may deliver all six batches.
        meeting = partial(pool_that_meets, str(tmp_path))
        collector = MultiaSyncDataCollector([meeting] * 2, None, frames_per_batch=80, total_frames=480)
    else:
        collector = aSyncDataCollector(pool_of_sleepy, None, frames_per_batch=80, total_frames=480)
    try:
        batches = [b.clone() for b in collector]
    finally:
        collector.shutdown()
    assert sum(b.numel() for b in batches) == 480
    assert met(tmp_path) == (16 if kind == "MultiaSync" else 0)  # every env met
    workers = set()
    for b in batches:
        nxt, obs = b["next", "observation"][..., 0], b["observation"][..., 0]
        done = b["next", "done"][..., 0]
        assert torch.equal(nxt, obs + 1)  # real transitions, every env
        assert torch.equal(done, nxt == 5)
        workers |= set(b["collector", "worker_id"].unique().tolist())
    assert workers == ({0} if kind == "aSync" else {0, 1})
    if kind == "MultiSync":
        assert [b.shape for b in batches] == [torch.Size([2, 8, 10])] * 3  # [workers, envs, steps]


class Lagging(SleepyAsyncEnv):
    """Env 0 of a pool is slow (``slow`` s per step), the others fast."""

    def __init__(self, delay: float, episode_length: int = 1000) -> None:
        super().__init__(delay=delay, episode_length=episode_length)


def lagging_pool(slow: float = 0.3, n: int = 8, **kwargs: Any) -> AsyncEnvPool:
    return AsyncEnvPool([Lagging(slow if i == 0 else 0.001) for i in range(n)], **kwargs)


@pytest.mark.anyio
@pytest.mark.all_backends
async def test_barrier_free_batches_are_flat_grouped_by_env_with_exact_trajectories() -> None:
    pool = AsyncEnvPool([SleepyAsyncEnv(delay=0.001 * (i + 1), episode_length=4) for i in range(6)], min_ready=2)
    with anyio.fail_after(20):
        batches, _ = await collect_n(pool, 60, 3)
    for b in batches:
        assert b.shape == (60,)
        env_id = b["collector", "env_id"]
        assert torch.equal(env_id, env_id.sort().values)  # grouped by env
        for i in env_id.unique().tolist():
            rows = b[env_id == i]
            obs, nxt = rows["observation"][:, 0], rows["next", "observation"][:, 0]
            done, traj = rows["next", "done"][:, 0], rows["collector", "traj_ids"]
            assert torch.equal(nxt, obs + 1)  # real transitions
            assert torch.equal(done, nxt == 4)
            # In time order: each frame starts where the previous ended, or at 0 after a reset.
            assert torch.equal(obs[1:], torch.where(done[:-1], torch.zeros_like(obs[1:]), nxt[:-1]))
            assert torch.equal(traj[1:] != traj[:-1], done[:-1])  # a new trajectory exactly after each end
    traj_sets = [set(b["collector", "traj_ids"].tolist()) for b in batches]
    assert traj_sets[0] & traj_sets[1]  # trajectories go on across batches


async def collect_n(pool: Any, frames: int, n_batches: int, **kwargs: Any) -> tuple[list[Any], Any]:
    async with Collector(lambda: pool, frames_per_batch=frames, total_frames=frames * n_batches, **kwargs) as c:
        batches = [b async for b in c]
        return batches, c.stats()


@pytest.mark.anyio
@pytest.mark.all_backends
async def test_barrier_free_iteration_without_async_with_is_refused_and_closes_the_pool() -> None:
    # Its steps outlive a batch: they need the collector's task group, which only 'async with' opens.
    envs = [SleepyAsyncEnv(delay=0.001, episode_length=4) for _ in range(4)]
    c = Collector(lambda: AsyncEnvPool(envs, min_ready=2), frames_per_batch=8, total_frames=16)
    with anyio.fail_after(20):
        with pytest.raises(
            RuntimeError, match=r"Collector's env steps are tasks .* iterate it inside 'async with collector:'$"
        ):
            async for _ in c:
                pass
    assert repr(c).startswith("<Collector [closed")


@pytest.mark.anyio
async def test_barrier_free_envs_do_not_wait_for_the_slowest() -> None:
    with anyio.fail_after(20):
        (b,), _ = await collect_n(lagging_pool(min_ready=1), 200, 1)
    counts = torch.bincount(b["collector", "env_id"], minlength=8).tolist()
    assert counts[0] <= 2 and min(counts[1:]) >= 20, counts  # lock-step would give 25 each


@pytest.mark.anyio
async def test_max_wait_lets_the_ready_envs_go_on_without_min_ready() -> None:
    with anyio.fail_after(30):
        (gated,), _ = await collect_n(lagging_pool(slow=0.05, min_ready=8), 80, 1)
        (waited,), _ = await collect_n(lagging_pool(slow=0.05, min_ready=8, max_wait=0.005), 80, 1)
    gated_counts = torch.bincount(gated["collector", "env_id"], minlength=8).tolist()
    waited_counts = torch.bincount(waited["collector", "env_id"], minlength=8).tolist()
    assert max(gated_counts) - min(gated_counts) <= 1, gated_counts  # every policy call waits for all 8
    assert waited_counts[0] <= 3 and min(waited_counts[1:]) >= 10, waited_counts


@pytest.mark.anyio
async def test_split_trajs_cuts_barrier_free_batches_into_ordered_trajectories() -> None:
    pool = AsyncEnvPool([SleepyAsyncEnv(delay=0.001 * (i % 3 + 1), episode_length=5) for i in range(4)], min_ready=1)
    with anyio.fail_after(20):
        (b,), _ = await collect_n(pool, 64, 1, split_trajs=True)
    mask = b["collector", "mask"]
    for row in range(b.shape[0]):
        obs = b["observation"][row, :, 0][mask[row]]
        assert torch.equal(obs, torch.arange(len(obs), dtype=obs.dtype) + obs[0])  # consecutive steps
        assert b["collector", "traj_ids"][row][mask[row]].unique().numel() == 1


def test_barrier_free_pool_arguments_and_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^min_ready must be at most the number of envs \(2\), got 3$"):
        AsyncEnvPool([SleepyAsyncEnv(), SleepyAsyncEnv()], min_ready=3)
    with pytest.raises(ValueError, match=r"^max_wait only applies to barrier-free pools; pass min_ready= too$"):
        AsyncEnvPool([SleepyAsyncEnv()], max_wait=0.1)

    async def main() -> None:
        async with Collector(lambda: lagging_pool(min_ready=1), frames_per_batch=8, max_frames_per_traj=5) as c:
            async for _ in c:
                pass

    with pytest.raises(ValueError, match=r"^max_frames_per_traj=5 is not supported with a barrier-free AsyncEnvPool"):
        anyio.run(main)


class Stuck(SleepyAsyncEnv):
    """A step that waits far longer than the test; records that it was cancelled."""

    def __init__(self, cancelled: list[int], i: int) -> None:
        super().__init__(delay=60.0)
        self.cancelled, self.i = cancelled, i

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        try:
            return await super().step(action)
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(self.i)
            raise


@pytest.mark.anyio
@pytest.mark.all_backends
@pytest.mark.parametrize("min_ready", [None, 1])
async def test_cancelling_the_collector_cancels_every_step_in_flight(min_ready: int | None) -> None:
    cancelled: list[int] = []
    pool = AsyncEnvPool([Stuck(cancelled, i) for i in range(32)], min_ready=min_ready)
    with anyio.fail_after(10):
        with anyio.move_on_after(0.5) as scope:
            async with Collector(lambda: pool, frames_per_batch=64) as c:
                async for _ in c:
                    pass
    assert scope.cancelled_caught
    assert sorted(cancelled) == list(range(32))  # every env's step was cancelled, and awaited


class Deaf(SleepyAsyncEnv):
    """A step that ignores cancellation until ``released`` is set; ``entered`` counts steps begun."""

    def __init__(self, entered: list[int], all_in: anyio.Event, released: anyio.Event) -> None:
        super().__init__(delay=0.0)
        self.entered, self.all_in, self.released = entered, all_in, released

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.entered.append(1)
        if len(self.entered) == 4:
            self.all_in.set()
        while not self.released.is_set():
            try:
                await self.released.wait()
            except anyio.get_cancelled_exc_class():
                pass  # swallowed: what a misbehaving client library does
        return await super().step(action)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", ("asyncio", {"use_uvloop": True})], indirect=True)
@pytest.mark.parametrize("min_ready", [None, 1])
async def test_leaving_is_bounded_when_an_env_step_ignores_cancellation(min_ready: int | None) -> None:
    entered: list[int] = []
    all_in, released = anyio.Event(), anyio.Event()
    pool = AsyncEnvPool([Deaf(entered, all_in, released) for _ in range(4)], min_ready=min_ready)

    async def collect() -> None:
        async with Collector(lambda: pool, frames_per_batch=8, shutdown_timeout=0.3) as c:
            async for _ in c:
                pass

    with anyio.fail_after(10):
        with pytest.warns(RuntimeWarning, match=r"4 env step\(s\) .*ignored cancellation for (shutdown_timeout=)?0.3s"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(collect)
                await all_in.wait()  # every env's step is in flight
                tg.cancel_scope.cancel()
        released.set()  # the abandoned steps end now, before the test's loop closes
        await anyio.wait_all_tasks_blocked()


@pytest.mark.anyio
@pytest.mark.all_backends
async def test_a_straggler_never_holds_a_barrier_free_batch_back() -> None:
    # Env 0's steps take 30 s: batches must come from the other envs meanwhile, and leaving
    # the collector must cancel the straggler's step rather than wait for it.
    pool = lagging_pool(slow=30.0, min_ready=1)
    with anyio.fail_after(10):
        batches, _ = await collect_n(pool, 100, 3)
    for b in batches:
        assert b.shape == (100,)
        assert 0 not in b["collector", "env_id"].tolist()  # its step is still in flight


@pytest.mark.anyio
@pytest.mark.parametrize(("n", "gc_freeze", "frozen"), [(256, None, True), (4, None, False), (4, True, True),
                                                        (256, False, False)])  # fmt: skip
async def test_gc_freeze_holds_while_the_pool_runs_and_ends_with_it(
    n: int, gc_freeze: bool | None, frozen: bool
) -> None:
    import gc

    base = _INTERPRETER_FROZEN  # 0, or the immortal objects Python 3.12 keeps there (375 on 3.12.1)
    pool = AsyncEnvPool([SleepyAsyncEnv(delay=0.0) for _ in range(n)], gc_freeze=gc_freeze)
    seen = []
    with anyio.fail_after(30):
        async with Collector(lambda: pool, frames_per_batch=2 * n, total_frames=4 * n) as c:
            async for _ in c:
                seen.append(gc.get_freeze_count() > base)
    assert seen == [frozen, frozen]
    assert gc.get_freeze_count() <= base  # undone when the pool closed


@pytest.mark.anyio
async def test_gc_freeze_leaves_a_freeze_of_the_process_itself_in_place() -> None:
    import gc

    gc.freeze()
    try:
        own = gc.get_freeze_count()
        pool = AsyncEnvPool([SleepyAsyncEnv(delay=0.0) for _ in range(4)], gc_freeze=True)
        with anyio.fail_after(30):
            async with Collector(lambda: pool, frames_per_batch=8, total_frames=8) as c:
                async for _ in c:
                    assert gc.get_freeze_count() >= own
        assert gc.get_freeze_count() >= own  # not unfrozen: the freeze was the process's own
    finally:
        gc.unfreeze()


def test_gc_freeze_must_be_a_bool_or_none() -> None:
    with pytest.raises(TypeError, match=r"gc_freeze must be True, False or None, got 'yes'"):
        AsyncEnvPool([SleepyAsyncEnv(delay=0.0)], gc_freeze="yes")  # type: ignore[arg-type]

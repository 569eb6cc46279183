"""Multi-process collectors feeding a ReplayBuffer: workers write straight into shared storage."""

from __future__ import annotations

import time
from functools import partial

import anyio
import pytest
import torch

from aiocollect import (
    MemoryStorage,
    MultiAsyncCollector,
    MultiSyncCollector,
    ReplayBuffer,
    SharedMemoryStorage,
    WorkerError,
    WouldBlock,
)
from aiocollect.testing import CountingEnv, FailingEnv, ScriptedPolicy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

LENGTH = 5


def worker_envs(n: int, num_envs: int = 2) -> list[partial[CountingEnv]]:
    """One factory per worker; worker w's envs are numbered w * num_envs, ... (frames name the worker)."""
    return [partial(CountingEnv, num_envs, LENGTH, first_index=w * num_envs) for w in range(n)]


def expected(num_envs_total: int, steps: int) -> list[tuple[int, int, int]]:
    return sorted((e, t // LENGTH, t % LENGTH) for e in range(num_envs_total) for t in range(steps))


def stored(rb: ReplayBuffer) -> list[tuple[int, int, int]]:
    return sorted(tuple(int(x) for x in row) for row in rb.storage.tensors["observation"][rb._valid])


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_background_collection_stores_every_frame_exactly_once(cls: type, backend: str) -> None:
    rb = ReplayBuffer(100_000, batch_size=32, min_size=64)
    fpb = 32 if cls is MultiSyncCollector else 16  # 16 frames per worker batch either way
    with anyio.fail_after(90):
        async with cls(
            worker_envs(2), num_workers=2, frames_per_batch=fpb, total_frames=640, replay_buffer=rb, backend=backend
        ) as c:
            # Worker processes need shared storage: upgraded before anything was built.
            # Worker threads write into the process-local storage it has.
            assert isinstance(rb.storage, MemoryStorage if backend == "inline" else SharedMemoryStorage)
            c.start()
            await rb.sample()
            while c.is_running():
                await rb.sample()
            # Workers wrote into the buffer's rows; the parent's slots were never used.
            assert all(
                float(slot["observation"].abs().sum()) == 0
                for w in range(2)
                for slot in (c._transport.batch(w, 0), c._transport.batch(w, 1))
            )
    frames = stored(rb)
    assert len(frames) == len(set(frames)) == rb.write_count == c.stats().frames
    if cls is MultiSyncCollector:  # each worker collected exactly half, in lock step
        assert frames == expected(4, 160)
    else:  # first come first served: per env, a prefix of its frame sequence, nothing skipped
        per_env: dict[int, list[tuple[int, int]]] = {}
        for e, ep, step in frames:
            per_env.setdefault(e, []).append((ep, step))
        for seq in per_env.values():
            assert seq == [(t // LENGTH, t % LENGTH) for t in range(len(seq))]


async def test_a_built_process_local_storage_is_refused_before_spawning() -> None:
    rb = ReplayBuffer(100, storage=MemoryStorage())
    await rb.extend(CountingEnv(2).reset())
    with pytest.raises(TypeError, match=r"^the replay buffer's MemoryStorage lives in this process only"):
        MultiAsyncCollector(worker_envs(2), frames_per_batch=8, replay_buffer=rb)


async def test_sample_raises_the_worker_error_when_the_collector_dies(backend: str) -> None:
    rb = ReplayBuffer(10_000, batch_size=8, min_size=10_000)  # never reached: only the error ends the wait
    with anyio.fail_after(90):
        async with MultiAsyncCollector([partial(FailingEnv, 1, fail_at=20)], frames_per_batch=4,
                                       replay_buffer=rb, backend=backend) as c:  # fmt: skip
            c.start()
            with pytest.raises(WorkerError) as info:
                await rb.sample()
    assert info.value.worker_id == 0 and "FailingEnv failed at step 20" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


async def test_rate_limiter_holds_fast_workers_back(backend: str) -> None:
    spi, tol = 1.0, 64.0
    rb = ReplayBuffer(100_000, batch_size=16, min_size=32, samples_per_insert=spi, tolerance=tol)
    with anyio.fail_after(90):
        async with MultiAsyncCollector(
            worker_envs(2), num_workers=2, frames_per_batch=16, replay_buffer=rb, backend=backend
        ) as c:
            c.start()
            for _ in range(40):  # a slow learner: the workers are far faster
                await rb.sample()
                s = rb.stats()
                d = spi * (s.write_count - rb.min_size) - s.sample_count
                # checked before each write, and up to 2 batches per worker in flight
                assert d <= tol + spi * 16 * 4
    # Unthrottled, two workers write thousands of frames while 40 samples are drawn.
    assert rb.stats().samples_per_insert == pytest.approx(spi, rel=0.25)


async def test_pause_and_weight_updates_in_the_background(backend: str) -> None:
    policy = ScriptedPolicy(1.0)
    rb = ReplayBuffer(100_000, batch_size=8, min_size=8, max_policy_lag=0)
    with anyio.fail_after(90):
        async with MultiAsyncCollector(worker_envs(2), policy, num_workers=2, frames_per_batch=16,
                                       replay_buffer=rb, backend=backend) as c:  # fmt: skip
            c.start()
            await rb.wait_for(64)
            async with c.pause():
                written = rb.write_count
                await c.update_policy_weights_(ScriptedPolicy(-1.0))
                assert rb.policy_version == 1 and len(rb) == 0  # every version-0 frame is too old now
                assert rb.write_count == written
            batch = await rb.sample()
    assert (batch["collector", "policy_version"] == 1).all()
    assert torch.equal(batch["action"], ScriptedPolicy(-1.0)(batch["observation"]))


class SlowWorkerEnv(CountingEnv):
    """Worker 1's envs take 20 ms a step, so the fast worker always delivers first."""

    def step(self, action):  # type: ignore[no-untyped-def]
        if float(self.index.flatten()[0]) > 0:
            time.sleep(0.02)
        return super().step(action)


async def test_preemptive_threshold_cuts_stragglers_short(backend: str) -> None:
    envs = [partial(SlowWorkerEnv, 0, 10**6, first_index=w) for w in range(2)]
    with anyio.fail_after(90):
        async with MultiSyncCollector(envs, frames_per_batch=400, total_frames=400,
                                      preemptive_threshold=0.5, backend=backend) as c:  # fmt: skip
            batch = await c.__anext__()
            frames = c.stats().frames
    assert batch.shape == (2, 200)
    fast, slow = batch[0], batch[1]
    assert (fast["collector", "traj_ids"] >= 0).all()
    cut = slow["collector", "traj_ids"] == -1
    assert cut.any() and not cut[0]  # the slow worker stopped early, after at least one step
    assert (slow["collector", "policy_version"][cut] == -1).all() and (slow["observation"][cut] == 0).all()
    assert frames == 400 - int(cut.sum())  # only collected frames count
    # The cut is a suffix: a straggler stops, it does not skip steps.
    first_cut = int(cut.nonzero()[0])
    assert cut[first_cut:].all()


async def test_threshold_zero_cuts_every_worker_after_its_first_step(backend: str) -> None:
    # TorchRL's "stop after one step": no worker waits for another, and each takes at least one step.
    envs = [partial(SlowWorkerEnv, 0, 10**6, first_index=w + 1) for w in range(2)]  # both slow (20 ms)
    with anyio.fail_after(90):
        async with MultiSyncCollector(envs, frames_per_batch=400, total_frames=400,
                                      preemptive_threshold=0.0, backend=backend) as c:  # fmt: skip
            batch = await c.__anext__()
    taken = (batch["collector", "traj_ids"] >= 0).sum(-1)
    assert ((taken >= 1) & (taken < 200)).all(), taken.tolist()


async def test_a_concatenated_preempted_batch_holds_only_the_steps_taken(backend: str) -> None:
    envs = [partial(SlowWorkerEnv, 0, 10**6, first_index=w) for w in range(2)]
    with anyio.fail_after(90):
        async with MultiSyncCollector(envs, frames_per_batch=400, total_frames=400, cat_results=-1,
                                      preemptive_threshold=0.5, backend=backend) as c:  # fmt: skip
            batch = await c.__anext__()
            frames = c.stats().frames
    assert batch.ndim == 1 and 200 < batch.numel() < 400  # the fast worker's 200, the slow one's prefix
    assert (batch["collector", "traj_ids"] >= 0).all()  # no -1 padding in a joined batch
    assert batch.numel() == frames


async def test_trajectory_mode_assembles_whole_episodes_from_every_worker(backend: str) -> None:
    rb = ReplayBuffer(10_000)
    with anyio.fail_after(90):
        async with MultiSyncCollector(worker_envs(2), num_workers=2, frames_per_batch=16, total_frames=64,
                                      trajs_per_batch=2, replay_buffer=rb, backend=backend) as c:  # fmt: skip
            items = [b async for b in c]
    assert items == [None] * 4
    obs = rb.storage.tensors["observation"][: rb.write_count].long()
    # every stored run of frames is a whole episode of LENGTH consecutive steps of one env
    assert rb.write_count % LENGTH == 0 and rb.write_count > 0
    for run in obs.reshape(-1, LENGTH, 3):
        assert (run[:, 0] == run[0, 0]).all() and (run[:, 1] == run[0, 1]).all()
        assert run[:, 2].tolist() == list(range(LENGTH))
    assert set(obs[:, 0].tolist()) == {0, 1, 2, 3}  # both workers' envs


async def test_reset_at_each_iter_writes_only_whole_episodes(backend: str) -> None:
    # Episodes the per-batch reset abandons were joined to the next batch's (two episodes in a "whole" one).
    rb = ReplayBuffer(10_000)
    with anyio.fail_after(90):
        async with MultiAsyncCollector(worker_envs(2), num_workers=2, frames_per_batch=14, total_frames=112,
                                       trajs_per_batch=1, reset_at_each_iter=True, replay_buffer=rb,
                                       backend=backend) as c:  # fmt: skip
            assert [b async for b in c] == [None] * 8
    obs = rb.storage.tensors["observation"][: rb.write_count].long()
    # 7 steps per env and batch from a reset: one whole 5-step episode, then 2 abandoned steps.
    assert rb.write_count == 8 * 2 * LENGTH
    for run in obs.reshape(-1, LENGTH, 3):
        assert (run[:, 0] == run[0, 0]).all() and (run[:, 1] == run[0, 1]).all()
        assert run[:, 2].tolist() == list(range(LENGTH))


async def test_pause_while_workers_wait_for_the_rate_limiter_then_resume(backend: str) -> None:
    rb = ReplayBuffer(100_000, batch_size=16, min_size=32, samples_per_insert=1.0, tolerance=16)
    with anyio.fail_after(90):
        async with MultiAsyncCollector(
            worker_envs(2), num_workers=2, frames_per_batch=16, replay_buffer=rb, backend=backend
        ) as c:
            c.start()
            await rb.wait_for(32)
            while rb.stats().in_flight or not rb._notifier._waiters:  # every worker is held back
                await anyio.lowlevel.checkpoint()
            async with c.pause():
                while True:  # make room while paused: the waiting collector must hold nothing
                    try:
                        rb.sample_nowait()
                    except WouldBlock:
                        break
                await anyio.wait_all_tasks_blocked()
                written = rb.write_count
            await rb.wait_for(len(rb) + 1)  # collection resumed after the block
    assert rb.write_count > written


async def test_workers_write_into_a_memmap_storage(tmp_path, backend: str) -> None:  # type: ignore[no-untyped-def]
    from aiocollect import MemmapStorage

    rb = ReplayBuffer(1000, storage=MemmapStorage(tmp_path / "frames"))
    with anyio.fail_after(90):
        async with MultiSyncCollector(worker_envs(2), num_workers=2, frames_per_batch=32, total_frames=64,
                                      replay_buffer=rb, backend=backend) as c:  # fmt: skip
            assert [b async for b in c] == [None, None]
    assert stored(rb) == expected(4, 16)
    # The frames are in the files: a fresh mapping of the directory sees them.
    copy = ReplayBuffer(1000, storage="memmap")
    rb.dumps(str(tmp_path / "saved"))
    copy.loads(str(tmp_path / "saved"))
    assert stored(copy) == stored(rb)
    await copy.aclose()

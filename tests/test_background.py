"""In-process collectors writing into a ReplayBuffer: iteration, start(), pause(), errors."""

from __future__ import annotations

import anyio
import pytest
import torch

from aiocollect import Collector, ReplayBuffer, SyncDataCollector, blocking
from aiocollect.testing import CountingEnv, FailingEnv, ScriptedPolicy

pytestmark = pytest.mark.timeout(60)


def expected_frames(num_envs: int, length: int, steps: int) -> list[tuple[int, int, int]]:
    """The (env, episode, step) of the first ``steps`` frames of each CountingEnv env."""
    out = []
    for env in range(num_envs):
        out += [(env, t // length, t % length) for t in range(steps)]
    return sorted(out)


def stored_frames(rb: ReplayBuffer) -> list[tuple[int, int, int]]:
    obs = rb.storage.tensors["observation"][rb._valid]
    return sorted(tuple(int(x) for x in row) for row in obs)


@pytest.mark.anyio
async def test_iteration_with_a_buffer_yields_none_and_stores_every_frame_once() -> None:
    rb = ReplayBuffer(1000)
    async with Collector(lambda: CountingEnv(3, episode_length=4), frames_per_batch=30, total_frames=90,
                         replay_buffer=rb) as c:  # fmt: skip
        items = [b async for b in c]
    assert items == [None, None, None]
    assert rb.write_count == 90 == c.stats().frames
    assert stored_frames(rb) == expected_frames(3, 4, 30)
    # The same keys as an iterated batch, so TorchRL code reads the buffer unchanged.
    assert ("collector", "traj_ids") in rb.storage.tensors and ("next", "done") in rb.storage.tensors


@pytest.mark.anyio
@pytest.mark.all_backends
async def test_start_fills_the_buffer_in_the_background_while_the_trainer_samples() -> None:
    rb = ReplayBuffer(10_000, batch_size=16, min_size=64)
    with anyio.fail_after(30):
        async with Collector(lambda: CountingEnv(2, episode_length=5), frames_per_batch=32, total_frames=640,
                             replay_buffer=rb) as c:  # fmt: skip
            c.start()
            assert c.is_running()
            for _ in range(5):
                batch = await rb.sample()
                assert batch.shape == (16,)
            await rb.wait_for(640)
    assert not c.is_running()
    assert stored_frames(rb) == expected_frames(2, 5, 320)  # no frame lost or duplicated


@pytest.mark.anyio
async def test_pause_stops_writes_until_the_block_ends() -> None:
    rb = ReplayBuffer(100_000, batch_size=8, min_size=8)
    with anyio.fail_after(30):
        async with Collector(lambda: CountingEnv(2), frames_per_batch=16, replay_buffer=rb) as c:
            c.start()
            await rb.wait_for(32)
            async with c.pause():
                written = rb.write_count
                for _ in range(3):
                    await rb.sample()
                    await anyio.wait_all_tasks_blocked()
                assert rb.write_count == written
            await rb.wait_for(written + 16)  # collection resumed
            await c.async_shutdown()
    assert not c.is_running()


@pytest.mark.anyio
async def test_background_error_is_raised_by_the_next_sample() -> None:
    rb = ReplayBuffer(1000, batch_size=4, min_size=1000)  # never reached: sample waits
    with anyio.fail_after(30):
        async with Collector(lambda: FailingEnv(1, fail_at=10), frames_per_batch=4, replay_buffer=rb) as c:
            c.start()
            with pytest.raises(ValueError, match=r"^FailingEnv failed at step 10$"):
                await rb.sample()
    assert not c.is_running()


@pytest.mark.anyio
async def test_background_error_nobody_sampled_is_raised_at_shutdown() -> None:
    rb = ReplayBuffer(1000)
    with anyio.fail_after(30):
        with pytest.raises(ValueError, match=r"^FailingEnv failed at step 3$"):
            async with Collector(lambda: FailingEnv(1, fail_at=3), frames_per_batch=4, replay_buffer=rb) as c:
                c.start()
                await c.wait_finished()  # the env's failure ends it; the error waits for shutdown
                assert not c.is_running()


@pytest.mark.anyio
async def test_start_and_iteration_rules() -> None:
    plain = Collector(lambda: CountingEnv(1), frames_per_batch=4)
    async with plain:
        with pytest.raises(RuntimeError, match=r"^start\(\) needs a replay buffer to write into"):
            plain.start()
    rb = ReplayBuffer(100)
    c = Collector(lambda: CountingEnv(1), frames_per_batch=4, replay_buffer=rb)
    with pytest.raises(
        RuntimeError, match=r"^start\(\) needs an open Collector; call it inside 'async with collector:'$"
    ):
        c.start()
    async with c:
        with pytest.raises(RuntimeError, match=r"^wait_finished\(\) waits for background collection; call Collector"):
            await c.wait_finished()
        c.start()
        with pytest.raises(RuntimeError, match=r"^this Collector was already started"):
            c.start()
        with pytest.raises(RuntimeError, match=r"^this Collector collects in the background \(start\(\)\)"):
            await c.__anext__()
    with pytest.raises(RuntimeError, match=r"^pause\(\) only applies to a Collector running in the background"):
        async with Collector(lambda: CountingEnv(1), frames_per_batch=4, replay_buffer=rb).pause():
            pass


@pytest.mark.anyio
async def test_init_random_frames_counts_the_buffers_write_count() -> None:
    policy = ScriptedPolicy(1.0)

    def env() -> CountingEnv:
        return CountingEnv(4, episode_length=100)

    async def collect(rb: ReplayBuffer) -> None:
        async with Collector(env, policy, frames_per_batch=64, total_frames=64, init_random_frames=64,
                             replay_buffer=rb) as c:  # fmt: skip
            c.set_seed(0)
            _ = [b async for b in c]

    def actions_vs_policy(rb: ReplayBuffer, rows: slice) -> torch.Tensor:
        t = rb.storage.tensors
        return t["action"][rows] == policy(t["observation"][rows])

    fresh = ReplayBuffer(1000)
    await collect(fresh)
    assert not actions_vs_policy(fresh, slice(0, 64)).all()  # write_count 0 < 64: random actions
    prefilled = ReplayBuffer(1000)
    await prefilled.extend(fresh.storage.gather(torch.arange(64)))
    await collect(prefilled)
    assert actions_vs_policy(prefilled, slice(64, 128)).all()  # 64 frames already written: the policy acts


@pytest.mark.anyio
async def test_weight_updates_reach_the_background_and_the_buffer() -> None:
    policy = ScriptedPolicy(1.0)
    rb = ReplayBuffer(100_000, batch_size=8, min_size=8)
    with anyio.fail_after(30):
        async with Collector(lambda: CountingEnv(2, episode_length=1000), policy, frames_per_batch=8,
                             replay_buffer=rb) as c:  # fmt: skip
            c.start()
            await rb.wait_for(8)
            await c.update_policy_weights_(ScriptedPolicy(-1.0))
            assert rb.policy_version == 1
            written = rb.write_count
            await rb.wait_for(written + 32)
    t = rb.storage.tensors
    versions, actions, obs = (
        t[k][: rb.write_count] for k in (("collector", "policy_version"), "action", "observation")
    )
    assert (versions == 1).any()
    for version, weight in ((0, 1.0), (1, -1.0)):
        rows = versions == version
        assert torch.equal(actions[rows], ScriptedPolicy(weight)(obs[rows]))


def test_blocking_wait_finished_returns_once_the_budget_is_spent() -> None:
    rb = blocking.ReplayBuffer(1_000)
    collector = SyncDataCollector(lambda: CountingEnv(2), frames_per_batch=32, total_frames=320, replay_buffer=rb)
    collector.start()
    try:
        collector.wait_finished()
        assert not collector.is_running()
        assert len(rb) == 320  # the budget, written before the wait returned
    finally:
        collector.async_shutdown()
        rb.close()


def test_seed_documentation_pattern_with_blocking_classes() -> None:
    rb = blocking.ReplayBuffer(10_000, batch_size=32, min_size=256)
    collector = SyncDataCollector(lambda: CountingEnv(4), frames_per_batch=64, replay_buffer=rb)
    collector.start()
    try:
        for _ in range(20):
            data = rb.sample()
            assert data.shape == (32,)
        assert collector.is_running()
        with collector.pause():
            written = rb.write_count
            rb.sample()
            assert rb.write_count == written
    finally:
        collector.async_shutdown()
        rb.close()
    assert not collector.is_running()


@pytest.mark.anyio
async def test_samplers_stop_waiting_on_the_ratio_once_the_collector_is_done() -> None:
    # The learner runs ahead of samples_per_insert (0.25 per frame) as soon as the 256-frame
    # budget is collected: without the end-of-writes signal the last sample() waits forever.
    rb = ReplayBuffer(10_000, batch_size=32, min_size=64, samples_per_insert=0.25, tolerance=1)
    with anyio.fail_after(30):
        async with Collector(lambda: CountingEnv(2), frames_per_batch=64, total_frames=256, replay_buffer=rb) as c:
            c.start()
            for _ in range(10):
                await rb.sample()
    assert rb.write_count == 256 and rb.stats().sample_count == 320

"""Async envs are stepped on the event loop with overlapping waits; the loop never blocks."""

from __future__ import annotations

import anyio
import gymnasium as gym
import pytest
import torch

from aiocollect import AsyncEnvPool, Collector
from aiocollect.testing import SleepyAsyncEnv

pytestmark = [pytest.mark.anyio, pytest.mark.all_backends]


async def test_64_sleepy_envs_overlap_their_waits() -> None:
    # 64 envs x 10 steps x 10 ms: 6.4 s if stepped one after another, ~0.1 s overlapped.
    def pool() -> AsyncEnvPool:
        return AsyncEnvPool([SleepyAsyncEnv(delay=0.01) for _ in range(64)])

    with anyio.fail_after(2.5):
        async with Collector(pool, frames_per_batch=640, total_frames=640) as c:
            batches = [b async for b in c]
    assert batches[0].shape == (64, 10)
    obs, nxt = batches[0]["observation"], batches[0]["next", "observation"]
    assert torch.equal(nxt[..., 0, 0], obs[..., 0, 0] + 1)


async def test_async_env_episodes_reset_and_keep_real_transitions() -> None:
    def pool() -> AsyncEnvPool:
        return AsyncEnvPool([SleepyAsyncEnv(delay=0, episode_length=3) for _ in range(2)])

    async with Collector(pool, frames_per_batch=14, total_frames=14) as c:
        (batch,) = [b async for b in c]
    steps = batch["next", "observation"][0, :, 0]
    assert steps.tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert batch["next", "done"][0, :, 0].tolist() == [False, False, True] * 2 + [False]
    ids = batch["collector", "traj_ids"][0]
    assert ids[0] == ids[2] and ids[3] != ids[2] and ids[6] != ids[5]


async def test_heartbeat_keeps_running_during_cpu_bound_collection() -> None:
    # A loop blocked by env stepping would show gaps of a whole batch (tens of ms).
    policy = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))

    class Greedy(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return policy(obs).argmax(-1)

    def env_fn() -> gym.vector.VectorEnv:
        return gym.make_vec("CartPole-v1", 8, vectorization_mode="sync")

    gaps: list[float] = []
    done = anyio.Event()

    async def heartbeat() -> None:
        last = anyio.current_time()
        while not done.is_set():
            await anyio.sleep(0.001)
            now = anyio.current_time()
            gaps.append(now - last)
            last = now

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(heartbeat)
            async with Collector(env_fn, Greedy(), frames_per_batch=800, total_frames=-1) as c:
                async for _ in c:  # as many batches as 200 ticks take, however fast the machine
                    if len(gaps) >= 200:
                        break
            done.set()
    gaps.sort()
    p99 = gaps[int(len(gaps) * 0.99)]
    assert len(gaps) >= 200
    assert p99 < 0.04, f"p99 heartbeat gap {p99 * 1e3:.1f} ms"

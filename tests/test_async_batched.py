"""AsyncBatchedCollector: central inference over envs that step on their own.

`CountEnv` frames say which env made them, at which step of its episode, and with which
action (its reward), so every test can check that no frame is lost, duplicated, reordered
or mismatched, whatever the env backend.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import gymnasium as gym
import pytest
import torch
from _central_envs import AsyncCountEnv, AsyncSlowEnvs, CountEnv, Parity, SlowEnvs, assert_refused_before_build
from _leaks import still_running

from aiocollect import AsyncBatchedCollector, AsyncEnvPool, Collector, InferenceError, ReplayBuffer, WorkerError
from aiocollect import blocking as B
from aiocollect._envs._gcfreeze import _INTERPRETER_FROZEN

pytestmark = pytest.mark.anyio

ENV_BACKENDS = ["threading", "multiprocessing", "coroutine"]


def count_envs(n: int, backend: str, **kwargs: Any) -> list[Any]:
    kind = AsyncCountEnv if backend == "coroutine" else CountEnv
    return [partial(kind, i, **kwargs) for i in range(n)]


def check_batch(batch: Any) -> None:
    """Grouped by env, each env's frames in time order, every frame internally consistent."""
    env = batch["collector", "env_id"]
    assert bool((env[1:] >= env[:-1]).all()), "frames are grouped by env"
    check_frames(batch)


def check_frames(batch: Any) -> None:
    """Each frame is one env's step: its own env, its own action, one step on."""
    env = batch["collector", "env_id"]
    assert torch.equal(env, batch["env_index"])
    obs, nxt = batch["observation"], batch["next", "observation"]
    assert torch.equal(obs[:, 0].long(), env), "each frame is its own env's"
    assert torch.equal(nxt[:, 1], obs[:, 1] + 1), "next observation is one step on"
    assert torch.equal(batch["next", "reward"].squeeze(-1), batch["action"].float()), "the frame's own action"
    done = batch["next", "done"].squeeze(-1)
    assert torch.equal(done, nxt[:, 1] >= 3 + env.float()), "done exactly at each episode's end"


def per_env(batches: list[Any], n: int) -> dict[int, list[tuple[float, int, bool]]]:
    """Each env's frames across batches as (step in episode, traj id, done), in order."""
    out: dict[int, list[tuple[float, int, bool]]] = {i: [] for i in range(n)}
    for b in batches:
        columns = (b["collector", "env_id"], b["observation"][:, 1], b["collector", "traj_ids"], b["next", "done"])
        for e, t, traj, d in zip(*(c.reshape(-1).tolist() for c in columns), strict=True):
            out[e].append((t, traj, d))
    return out


def check_continuity(batches: list[Any], n: int) -> None:
    """No frame lost or duplicated: each env's steps run 0, 1, ..., end, 0, 1, ... across batches."""
    for e, frames in per_env(batches, n).items():
        assert frames, f"env {e} made no frame"
        assert frames[0][0] == 0
        for (t0, traj0, d0), (t1, traj1, _) in itertools.pairwise(frames):
            if d0:
                assert t1 == 0 and traj1 != traj0, f"env {e}: a new episode after each end"
            else:
                assert t1 == t0 + 1 and traj1 == traj0, f"env {e}: steps follow each other"


@pytest.mark.all_backends
@pytest.mark.parametrize("env_backend", ENV_BACKENDS)
async def test_every_frame_once_grouped_by_env_in_order(env_backend: str) -> None:
    n, fpb = 6, 50
    policy = Parity()
    batches = []
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(n, env_backend), policy=policy, frames_per_batch=fpb,
                                         total_frames=fpb * 4, env_backend=env_backend,
                                         envs_per_worker=3) as c:  # fmt: skip
            async for batch in c:
                assert batch.shape == (fpb,)
                check_batch(batch)
                assert bool((batch["action"] == batch["observation"][:, 1].long() % 2).all()), "the policy's action"
                batches.append(batch)
    assert len(batches) == 4
    check_continuity(batches, n)


@pytest.mark.parametrize("env_backend", ["threading", "multiprocessing"])
async def test_forward_passes_take_at_most_max_batch_size(env_backend: str) -> None:
    policy = Parity()
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(8, env_backend), policy=policy, frames_per_batch=40,
                                         total_frames=120, max_batch_size=3, env_backend=env_backend) as c:  # fmt: skip
            async for batch in c:
                check_batch(batch)
    assert policy.sizes and max(policy.sizes[1:]) <= 3  # the first call (size 1) learns the layout


async def test_forward_passes_wait_for_min_batch_size_across_shards() -> None:
    policy = Parity()
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(8, "threading"), policy=policy, frames_per_batch=64,
                                         total_frames=192, min_batch_size=8, server_timeout=30.0,
                                         envs_per_worker=2) as c:  # fmt: skip
            async for batch in c:
                check_batch(batch)
    assert set(policy.sizes[1:]) == {8}, "four shards, but every forward pass waits for all eight envs"


async def test_server_timeout_runs_the_envs_that_are_ready() -> None:
    """Env 7 holds its second step until the first batch is out: the others go on without it."""
    release = threading.Event()

    def gate(env_id: int, steps: int) -> None:
        if env_id == 7 and steps == 1:
            release.wait(30)

    policy = Parity()
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(8, "threading", gate=gate), policy=policy, frames_per_batch=40,
                                         total_frames=80, min_batch_size=8, server_timeout=0.02,
                                         envs_per_worker=4) as c:  # fmt: skip
            batches = []
            async for batch in c:
                check_batch(batch)
                batches.append(batch)
                release.set()
    first = batches[0]["collector", "env_id"]
    assert int((first == 7).sum()) == 1, "env 7 made its first frame only, while it waited"
    assert int((first < 4).sum()) > 4, "envs of the other shard stepped on"
    assert min(policy.sizes[1:]) < 8, "partial forward passes after server_timeout"


async def test_a_deterministic_policy_gives_each_env_the_collector_trajectory() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

    class Greedy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return self.net(observation).argmax(-1)

    n, frames = 4, 200
    make = partial(gym.make, "CartPole-v1")
    vec = partial(gym.vector.SyncVectorEnv, [make] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    with anyio.fail_after(60):
        async with Collector(vec, Greedy(), frames_per_batch=frames, total_frames=frames) as c:
            c.set_seed(7)
            (ref,) = [b async for b in c]  # [n, frames / n]
        async with AsyncBatchedCollector([make] * n, policy=Greedy(), frames_per_batch=frames,
                                         total_frames=frames) as central:  # fmt: skip
            central.set_seed(7)
            (got,) = [b async for b in central]
    env = got["collector", "env_id"]
    for i in range(n):
        mine = got[env == i]
        k = min(mine.shape[0], ref.shape[1])
        assert k > 10
        for key in ("observation", "action", ("next", "observation"), ("next", "done")):
            assert torch.equal(mine[key][:k], ref[i, :k][key]), f"env {i}, {key}"


async def test_frames_carry_the_version_that_chose_their_action() -> None:
    policy = Parity()
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(4, "threading"), policy=policy, frames_per_batch=40,
                                         total_frames=160) as c:  # fmt: skip
            versions = []
            async for batch in c:
                check_batch(batch)
                assert torch.equal(batch["policy_version"], batch["collector", "policy_version"])
                versions.append(batch["policy_version"])
                if len(versions) == 1:
                    await c.update_policy_weights_()
    assert set(versions[0].tolist()) == {0}
    assert set(versions[-1].tolist()) == {1}, "the update reaches every env's later actions"


async def test_a_failing_env_is_named_threading() -> None:
    envs = [partial(CountEnv, i, fail_at=5 if i == 2 else None) for i in range(4)]
    with anyio.fail_after(60), pytest.raises(ValueError, match="CountEnv 2 broke") as info:
        async with AsyncBatchedCollector(envs, frames_per_batch=400, total_frames=800) as c:
            async for _ in c:
                pass
    assert any("env 2" in note for note in info.value.__notes__)


async def test_a_failing_env_is_named_multiprocessing() -> None:
    envs = [partial(CountEnv, i, fail_at=5 if i == 3 else None) for i in range(4)]
    with anyio.fail_after(60), pytest.raises(WorkerError, match="CountEnv 3 broke") as info:
        async with AsyncBatchedCollector(envs, frames_per_batch=400, total_frames=800,
                                         env_backend="multiprocessing", envs_per_worker=2) as c:  # fmt: skip
            async for _ in c:
                pass
    assert info.value.worker_id == 1, "env 3 steps in the second worker"
    assert isinstance(info.value.__cause__, ValueError)
    assert "in step" in str(info.value.__cause__.__cause__), "the worker's traceback"


async def test_a_failing_policy_raises_its_error() -> None:
    class Broken(torch.nn.Module):
        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("policy broke")

    with anyio.fail_after(60), pytest.raises(RuntimeError, match="policy broke"):
        async with AsyncBatchedCollector(count_envs(4, "threading"), policy=Broken(), frames_per_batch=40) as c:
            async for _ in c:
                pass


@pytest.mark.parametrize("env_backend", ENV_BACKENDS)
@pytest.mark.parametrize("how", ["break", "raise", "cancel"])
async def test_every_exit_path_stops_the_envs(env_backend: str, how: str) -> None:
    release = anyio.Event()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async with AsyncBatchedCollector(count_envs(4, env_backend), frames_per_batch=20,
                                                 env_backend=env_backend) as c:  # fmt: skip
                    async for _ in c:
                        if how == "break":
                            break
                        if how == "raise":
                            raise KeyError("in the loop body")
                        release.set()
                        await anyio.sleep_forever()

            if how == "raise":
                with pytest.raises(KeyError):
                    await consume()
            else:
                tg.start_soon(consume)
                if how == "cancel":
                    await release.wait()
                    tg.cancel_scope.cancel()


def check_fresh_starts(batches: list[Any], n: int) -> None:
    """With ``reset_at_each_iter``, each batch restarts every env, whatever the envs' speeds.

    A barrier-free batch holds what is ready first, so per env and batch there is at most one
    frame of the step that was in flight when the previous batch filled (its old trajectory, one
    step on from where it was), then the frames of one new trajectory from step 0 on; an env
    slower than the others may have fewer frames, or none. Each reset gives env ``e`` the
    trajectory id ``n * batch + e`` (ids are allocated per reset, in env order, as in TorchRL).
    """
    last: dict[int, tuple[int, int]] = {}  # env -> (traj id, step) of its latest frame
    for i, b in enumerate(batches):
        for e, got in per_env([b], n).items():
            frames = [(j, int(s)) for s, j, _ in got]
            if frames and i > 0 and frames[0][0] == n * (i - 1) + e:
                left, frames = frames[0], frames[1:]
                # It goes on from the env's latest frame, or opens the trajectory if that had none.
                prev = last.get(e)
                want = (prev[0], prev[1] + 1) if prev is not None and prev[0] == left[0] else (left[0], 0)
                assert left == want, f"env {e}, batch {i}: the frame of the step in flight"
            assert frames == [(n * i + e, s) for s in range(len(frames))], f"env {e} starts afresh in batch {i}"
            if frames:
                last[e] = frames[-1]


@pytest.mark.parametrize("env_backend", ENV_BACKENDS)
@pytest.mark.parametrize("slow_shard", [False, True], ids=["even", "slow-shard"])
async def test_reset_at_each_iter_restarts_every_env_each_batch(env_backend: str, slow_shard: bool) -> None:
    # A shard of envs slower than the other (a busy machine, a slow env) must not stop the resets;
    # every third step of envs 2 and 3 lags, so their leftover frames open or continue a trajectory.
    gate = (AsyncSlowEnvs if env_backend == "coroutine" else SlowEnvs)({2, 3}, 0.03, every=3) if slow_shard else None
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(4, env_backend, length=10_000, gate=gate), frames_per_batch=40,
                                         total_frames=160, reset_at_each_iter=True, env_backend=env_backend,
                                         envs_per_worker=2) as c:  # fmt: skip
            batches = [b async for b in c]
    assert [b.numel() for b in batches] == [40] * 4
    check_fresh_starts(batches, 4)


@pytest.mark.parametrize("env_backend", ["threading", "multiprocessing"])
async def test_reset_at_each_iter_with_waits_for_every_env_gives_each_its_share(env_backend: str) -> None:
    # The docs' advice: forward passes that wait for every env step them all together, so each
    # batch holds every env's fresh start and an equal share, however slow one shard is.
    gate = SlowEnvs({2, 3}, 0.03, every=3)
    with anyio.fail_after(60):
        envs = count_envs(4, env_backend, length=10_000, gate=gate)
        async with AsyncBatchedCollector(envs, frames_per_batch=40, total_frames=120, reset_at_each_iter=True,
                                         min_batch_size=4, server_timeout=30.0, env_backend=env_backend,
                                         envs_per_worker=2) as c:  # fmt: skip
            batches = [b async for b in c]
    for i, b in enumerate(batches):
        env, t, traj = b["collector", "env_id"], b["observation"][:, 1].long(), b["collector", "traj_ids"]
        assert torch.equal(env, torch.arange(4).repeat_interleave(10)), f"batch {i}: ten frames per env"
        assert torch.equal(t, torch.arange(10).repeat(4)), f"batch {i}: each env from step 0"
        assert torch.equal(traj, 4 * i + env), f"batch {i}: a new trajectory per env"


@pytest.mark.parametrize("slow_shard", [False, True], ids=["even", "slow-env"])
async def test_reset_at_each_iter_restarts_every_env_of_a_barrier_free_pool(slow_shard: bool) -> None:
    # The same rule for an AsyncEnvPool(min_ready=) in the in-process Collector (StreamRollout).
    gate = AsyncSlowEnvs({2, 3}, 0.03, every=3) if slow_shard else None
    pool = AsyncEnvPool([AsyncCountEnv(i, length=10_000, gate=gate) for i in range(4)], min_ready=1)
    with anyio.fail_after(60):
        async with Collector(pool, frames_per_batch=40, total_frames=160, reset_at_each_iter=True) as c:
            batches = [b async for b in c]
    assert [b.numel() for b in batches] == [40] * 4
    check_fresh_starts(batches, 4)


async def test_set_truncated_ends_each_env_run_in_the_batch() -> None:
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(4, "threading", length=10_000), frames_per_batch=40,
                                         total_frames=40, set_truncated=True) as c:  # fmt: skip
            (batch,) = [b async for b in c]
    env = batch["collector", "env_id"]
    last = torch.ones_like(env, dtype=torch.bool)
    last[:-1] = env[1:] != env[:-1]
    assert torch.equal(batch["next", "truncated"].squeeze(-1), last)


async def test_writes_into_a_replay_buffer() -> None:
    rb = ReplayBuffer(1000)
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(4, "threading"), frames_per_batch=32, total_frames=96,
                                         replay_buffer=rb) as c:  # fmt: skip
            assert [b async for b in c] == [None, None, None]
    assert len(rb) == 96
    check_frames(rb.sample_nowait(32))


def test_the_blocking_twin_collects() -> None:
    with B.AsyncBatchedCollector(count_envs(3, "threading"), frames_per_batch=30, total_frames=60) as c:
        batches = list(c)
    assert [b.shape for b in batches] == [torch.Size([30])] * 2
    for b in batches:
        check_batch(b)
    check_continuity(batches, 3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"create_env_fn": []}, TypeError, "non-empty list of env factories"),
        ({"create_env_fn": "CartPole-v1"}, TypeError, "non-empty list of env factories"),
        ({"create_env_fn": [3]}, TypeError, r"create_env_fn\[0\] must be an env id or a callable"),
        ({"min_batch_size": 5, "max_batch_size": 4}, ValueError, "min_batch_size must be at most max_batch_size"),
        ({"min_batch_size": 3}, ValueError, r"at most the number of envs \(2\)"),
        ({"max_batch_size": 0}, ValueError, "max_batch_size must be"),
        ({"server_timeout": -1}, ValueError, "server_timeout"),
        ({"env_backend": "ray"}, ValueError, "env_backend must be one of"),
        ({"start_method": "spawn"}, ValueError, "start_method applies to env_backend='multiprocessing'"),
        ({"create_env_kwargs": [{}]}, ValueError, r"one per env \(2\)"),
        ({"frames_per_batch": 0}, ValueError, "frames_per_batch"),
        ({"yield_completed_trajectories": True, "set_truncated": True}, ValueError, "drop one of them"),
        ({"policy_timeout": 1.0}, ValueError, "policy_timeout applies to coroutine policies"),
        ({"gc_freeze": "yes"}, TypeError, "gc_freeze must be True, False or None, got 'yes'"),
    ],
)
def test_bad_arguments_fail_before_anything_is_built(kwargs: dict[str, Any], error: type, match: str) -> None:
    assert_refused_before_build(error, match, **kwargs)


@pytest.mark.parametrize(
    ("env_backend", "n", "gc_freeze", "frozen"),
    [
        ("threading", 256, None, True),
        ("threading", 4, None, False),
        ("threading", 256, False, False),
        ("multiprocessing", 4, True, True),
        ("coroutine", 256, None, True),
        ("coroutine", 4, False, False),
    ],
)
async def test_gc_freeze_holds_while_collecting_and_ends_at_close(
    env_backend: str, n: int, gc_freeze: bool | None, frozen: bool
) -> None:
    import gc

    base = _INTERPRETER_FROZEN  # 0, or the immortal objects Python 3.12 keeps there (375 on 3.12.1)
    seen = []
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(n, env_backend), frames_per_batch=n, total_frames=2 * n,
                                         env_backend=env_backend, gc_freeze=gc_freeze) as c:  # fmt: skip
            async for _ in c:
                seen.append(gc.get_freeze_count() > base)
    assert seen == [frozen, frozen]
    assert gc.get_freeze_count() <= base  # undone when the collector closed


@pytest.mark.parametrize("env_backend", ["threading", "coroutine"])
async def test_gc_freeze_ends_when_the_loop_body_raises(env_backend: str) -> None:
    import gc

    base = _INTERPRETER_FROZEN

    with anyio.fail_after(60), pytest.raises(RuntimeError, match="body"):
        async with AsyncBatchedCollector(
            count_envs(256, env_backend), frames_per_batch=256, env_backend=env_backend
        ) as c:
            async for _ in c:
                assert gc.get_freeze_count() > base
                raise RuntimeError("body")
    assert gc.get_freeze_count() <= base


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: gym.make_vec("CartPole-v1", 2), "a batched env"),
        (lambda: object(), "must return a gymnasium.Env, a TorchRL env or a coroutine env"),
    ],
)
async def test_a_factory_returning_the_wrong_kind_of_env_is_named(make: Any, match: str) -> None:
    with anyio.fail_after(30), pytest.raises(TypeError, match=match):
        async with AsyncBatchedCollector([make, make], frames_per_batch=10) as c:
            async for _ in c:
                pass


async def test_envs_with_different_spaces_are_refused() -> None:
    with anyio.fail_after(30), pytest.raises(ValueError, match="same spaces; env 1"):
        async with AsyncBatchedCollector([partial(gym.make, "CartPole-v1"), partial(gym.make, "Pendulum-v1")],
                                         frames_per_batch=10) as c:  # fmt: skip
            async for _ in c:
                pass


class CoroutineParity:
    """A coroutine policy (a model server's client in real life): Parity's action, counting calls in flight."""

    def __init__(self, answer: Any = None, fail_env: int | None = None, hang: bool = False) -> None:
        self.in_flight = self.most = self.calls = 0
        self.answer, self.fail_env, self.hang = answer, fail_env, hang

    async def __call__(self, td: Any) -> Any:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await anyio.lowlevel.checkpoint()
            self.calls += 1
            env = int(td["observation"][0])
            assert int(td["collector", "env_id"]) == env, "the request says which env asks"
            if self.hang:
                await anyio.sleep_forever()
            if env == self.fail_env and self.calls > 3:
                raise ConnectionError("the model server went away")
            if self.answer is not None:
                return self.answer
            return td.set("action", td["observation"][1].long() % 2)
        finally:
            self.in_flight -= 1


@pytest.mark.all_backends
@pytest.mark.parametrize("env_backend", ENV_BACKENDS)
async def test_a_coroutine_policy_is_awaited_per_env(env_backend: str) -> None:
    policy = CoroutineParity()
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(6, env_backend), policy=policy, frames_per_batch=40,
                                         total_frames=120, env_backend=env_backend, envs_per_worker=3,
                                         max_concurrency=2) as c:  # fmt: skip
            batches = []
            async for batch in c:
                check_batch(batch)
                assert bool((batch["action"] == batch["observation"][:, 1].long() % 2).all()), "its answers"
                batches.append(batch)
    check_continuity(batches, 6)
    assert policy.most == 2, "max_concurrency calls in flight, no more"


async def test_a_coroutine_policy_that_fails_names_the_env() -> None:
    with anyio.fail_after(60), pytest.raises(ConnectionError, match="went away") as info:
        async with AsyncBatchedCollector(count_envs(4, "threading"), policy=CoroutineParity(fail_env=1),
                                         frames_per_batch=400) as c:  # fmt: skip
            async for _ in c:
                pass
    assert "raised by the coroutine policy for env 1" in info.value.__notes__


async def test_a_coroutine_policy_past_its_timeout_is_named() -> None:
    with anyio.fail_after(60), pytest.raises(InferenceError, match=r"did not answer env \d within policy_timeout"):
        async with AsyncBatchedCollector(count_envs(2, "threading"), policy=CoroutineParity(hang=True),
                                         frames_per_batch=40, policy_timeout=0.05) as c:  # fmt: skip
            async for _ in c:
                pass


async def test_a_coroutine_policy_answer_of_the_wrong_shape_is_named() -> None:
    with anyio.fail_after(60), pytest.raises(InferenceError, match=r"shape \(3,\) for 'action'"):
        async with AsyncBatchedCollector(count_envs(2, "threading"), policy=CoroutineParity(answer=torch.zeros(3)),
                                         frames_per_batch=40) as c:  # fmt: skip
            async for _ in c:
                pass


async def test_a_coroutine_policy_version_moves_on_update_without_weights() -> None:
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(3, "threading"), policy=CoroutineParity(),
                                         frames_per_batch=30, total_frames=90) as c:  # fmt: skip
            versions = []
            async for batch in c:
                versions.append(set(batch["policy_version"].tolist()))
                if len(versions) == 1:
                    with pytest.raises(TypeError, match="holds its own weights"):
                        await c.update_policy_weights_({"w": torch.zeros(1)})
                    await c.update_policy_weights_()
                    assert c.policy_version == 1
    assert versions[0] == {0} and versions[-1] == {1}


@pytest.mark.parametrize("env_backend", ["threading", "coroutine"])
async def test_yield_completed_trajectories_yields_whole_episodes(env_backend: str) -> None:
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(4, env_backend), frames_per_batch=30, total_frames=300,
                                         yield_completed_trajectories=True, env_backend=env_backend) as c:  # fmt: skip
            batches = [b async for b in c]
    assert batches
    for b in batches:
        assert b.shape[0] >= 30
        check_frames(b)
        traj = b["collector", "traj_ids"]
        starts = torch.ones_like(traj, dtype=torch.bool)
        starts[1:] = traj[1:] != traj[:-1]
        assert torch.equal(b["observation"][:, 1] == 0, starts), "every episode whole, from its first step"
        ends = torch.ones_like(starts)
        ends[:-1] = starts[1:]
        assert torch.equal(b["next", "done"].squeeze(-1), ends), "... to its end"
        assert len(set(traj.tolist())) == int(starts.sum()), "each episode once"


async def test_yield_completed_trajectories_writes_episodes_to_a_buffer() -> None:
    rb = ReplayBuffer(1000)
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(3, "threading"), frames_per_batch=30, total_frames=120,
                                         yield_completed_trajectories=True, replay_buffer=rb) as c:  # fmt: skip
            async for _ in c:
                pass
    stored = rb.sample_nowait(len(rb)) if len(rb) else None
    assert stored is not None and 0 < len(rb) <= 120
    assert int(stored["next", "done"].sum()) > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("envs_per_worker", [None, 2])
async def test_a_policy_on_cuda_acts_from_pinned_host_memory(envs_per_worker: int | None) -> None:
    policy = Parity().to("cuda")
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(4, "threading"), policy=policy, device="cuda", frames_per_batch=40,
                                         total_frames=80, envs_per_worker=envs_per_worker) as c:  # fmt: skip
            batches = [b async for b in c]
            rollout: Any = c._rollout
            assert all(t.is_pinned() for t in rollout.cur.values())
    for b in batches:
        assert b.device is None or b.device.type == "cpu"
        check_batch(b)
        assert bool((b["action"] == b["observation"][:, 1].long() % 2).all())
    check_continuity(batches, 4)


@pytest.mark.parametrize(
    ("env_backend", "envs_per_worker"),
    [("threading", None), ("threading", 2), ("multiprocessing", 2), ("coroutine", None)],
)
def test_the_blocking_twin_iterates_without_with(env_backend: str, envs_per_worker: int | None) -> None:
    # TorchRL scripts iterate a collector without 'with': steps that are tasks still get an owner.
    c = B.AsyncBatchedCollector(count_envs(4, env_backend), frames_per_batch=30, total_frames=90,
                                env_backend=env_backend, envs_per_worker=envs_per_worker)  # fmt: skip
    batches = list(c)
    assert len(batches) == 3
    check_continuity(batches, 4)
    c.shutdown()


async def test_one_env_thread_or_env_processes_need_no_async_with() -> None:
    for env_backend in ("threading", "multiprocessing"):
        c = AsyncBatchedCollector(count_envs(4, env_backend), frames_per_batch=30, total_frames=60,
                                  env_backend=env_backend)  # fmt: skip
        with anyio.fail_after(60):
            batches = [b async for b in c]
            await c.aclose()
        check_continuity(batches, 4)


async def test_envs_stepped_by_tasks_ask_for_async_with() -> None:
    c = AsyncBatchedCollector(count_envs(4, "coroutine"), frames_per_batch=30, total_frames=60)
    with anyio.fail_after(60), pytest.raises(RuntimeError, match="inside 'async with collector:'"):
        async for _ in c:
            pass
    await c.aclose()


async def test_postproc_hooks_and_stats_see_every_batch() -> None:
    seen: list[int] = []

    def postproc(batch: Any) -> Any:
        batch["frame_count"] = torch.full((batch.shape[0],), batch.shape[0])
        return batch

    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(4, "multiprocessing"), frames_per_batch=32, total_frames=96,
                                         postproc=postproc, post_collect_hook=lambda b: seen.append(b.shape[0]),
                                         max_queued_batches=1, envs_per_worker=2) as c:  # fmt: skip
            batches = [b async for b in c]
            stats = c.stats()
    assert [int(b["frame_count"][0]) for b in batches] == [32, 32, 32]
    assert seen == [32, 32, 32]
    assert stats.frames == 96 and stats.batches == 3
    check_continuity(batches, 4)


@pytest.mark.parametrize("env_backend", ["threading", "multiprocessing"])
async def test_set_seed_and_reset_restart_the_envs_with_new_trajectories(env_backend: str) -> None:
    make = partial(gym.make, "CartPole-v1")
    firsts = []
    with anyio.fail_after(60):
        for _ in range(2):
            # Every forward pass waits for all three envs, so each has frames in the first batch
            # however the threads are scheduled (a starved shard could otherwise have none).
            async with AsyncBatchedCollector([make] * 3, frames_per_batch=30, total_frames=60, min_batch_size=3,
                                             server_timeout=30.0, env_backend=env_backend,
                                             envs_per_worker=2) as c:  # fmt: skip
                c.set_seed(11)
                batches = []
                async for b in c:
                    batches.append(b)
                    c.reset()  # the next batch starts every env afresh, with new trajectory ids
            firsts.append(batches[0])
            old, new = (set(b["collector", "traj_ids"].tolist()) for b in batches)
            assert len(new - old) >= 3
    first_obs = [first["observation"][first["collector", "env_id"] == 0][0] for first in firsts]
    assert torch.equal(*first_obs), "the same seed gives env 0 the same first observation"


CTRL_C_SCRIPT = """
import sys
import gymnasium
from aiocollect import blocking

if __name__ == "__main__":  # env worker processes import this file too
    try:
        with blocking.AsyncBatchedCollector([lambda: gymnasium.make("CartPole-v1")] * 4, frames_per_batch=200,
                                            env_backend="multiprocessing", envs_per_worker=2) as c:
            next(c)
            print(*[p.pid for p in c._async._env.backend._procs], flush=True)
            for _ in c:
                pass
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(3)
"""


def test_ctrl_c_in_a_blocking_script_stops_the_env_processes(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(CTRL_C_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 3, err
        assert "interrupted" in out
        assert still_running(pids, 10) == []
    finally:
        proc.kill()
        proc.communicate()


async def test_env_threads_step_at_the_same_time() -> None:
    # Envs 0 and 2 are in different shards: each waits at its first step for the other. Shards
    # stepped one after the other would break the barrier (a timeout), not meet at it.
    barrier = threading.Barrier(2, timeout=20)

    def gate(env_id: int, steps: int) -> None:
        if env_id in (0, 2) and steps == 0:
            barrier.wait()

    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(4, "threading", gate=gate), frames_per_batch=40, total_frames=40,
                                         envs_per_worker=2) as c:  # fmt: skip
            (batch,) = [b async for b in c]
    check_batch(batch)
    assert not barrier.broken


async def test_the_slot_pool_also_steps_lock_step() -> None:
    # The AsyncBatchedEnv protocol's own reset/step (what the collector's rollout does not use).
    import numpy as np
    from tensordict import TensorDict

    from aiocollect._serve._slots import SlotPool, ThreadShards

    envs = [CountEnv(i) for i in range(3)]
    threads = ThreadShards(envs, [np.array([0, 1]), np.array([2])], ["a", "b", "c"])
    pool = SlotPool(threads, threads.spec, min_ready=1, max_ready=None, max_wait=None)
    with anyio.fail_after(30):
        td = await pool.reset()
        assert td["observation"].tolist() == [[0, 0], [1, 0], [2, 0]]
        out = await pool.step(TensorDict(action=torch.tensor([1, 0, 1]), batch_size=[3]))
        assert out["observation"].tolist() == [[0, 1], [1, 1], [2, 1]]
        assert out["reward"].tolist() == [1.0, 0.0, 1.0]
        await pool.aclose()
    assert all(env.closed for env in envs)

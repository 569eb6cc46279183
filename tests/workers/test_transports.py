"""What differs between transports: start methods, what a worker process imports, thread limits."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import anyio
import pytest

# Its own module (imports torch only): workers unpickle the policy class from it, and a
# class from this test module would make them import this module's imports too.
from _plain_policy import ArgmaxPolicy

from aiocollect import MultiAsyncCollector, MultiSyncCollector, WorkerTimeoutError
from aiocollect.testing import CountingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver is the default on Linux only")
def test_forkserver_is_the_default_start_method_on_linux() -> None:
    c = MultiSyncCollector("CartPole-v1", num_workers=1, frames_per_batch=8)
    assert c._mc.transport_options == {"start_method": "forkserver"}


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
async def test_every_start_method_collects_the_same_data(start_method: str) -> None:
    with anyio.fail_after(60):
        async with MultiSyncCollector("CartPole-v1", ArgmaxPolicy(), num_workers=2, frames_per_batch=32,
                                      total_frames=64, start_method=start_method) as c:  # fmt: skip
            c.set_seed(3)
            batches = [b async for b in c]
    assert [tuple(b.shape) for b in batches] == [(2, 16), (2, 16)]
    assert batches[0]["collector", "worker_id"][:, 0].tolist() == [0, 1]


def _mapped_files(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/<pid>/maps")
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
async def test_a_worker_with_a_plain_module_policy_never_loads_tensordict(start_method: str) -> None:
    # tensordict's C extension shows in a process's memory map once tensordict is imported.
    with anyio.fail_after(60):
        async with MultiSyncCollector("CartPole-v1", ArgmaxPolicy(), num_workers=2, frames_per_batch=16,
                                      start_method=start_method) as c:  # fmt: skip
            await c.__anext__()
            await c.update_policy_weights_()
            await c.__anext__()
            maps = [_mapped_files(pid) for pid in c._worker_pids() if pid is not None]
    assert len(maps) == 2
    assert "torch" in maps[0]  # the check can see what a worker loaded
    assert not any("tensordict" in m for m in maps)


def test_the_inline_backend_takes_no_start_method() -> None:
    with pytest.raises(
        ValueError,
        match=r"^the inline backend runs workers as threads and takes no options, got \{'start_method': 'spawn'\}$",
    ):
        MultiSyncCollector(CountingEnv, num_workers=1, frames_per_batch=8, backend="inline", start_method="spawn")


def test_an_unknown_start_method_is_refused_before_spawning() -> None:
    with pytest.raises(
        ValueError, match=r"^start_method must be 'forkserver' or 'spawn' \(fork is unsafe with threads\), got 'fork'$"
    ):
        MultiSyncCollector(CountingEnv, num_workers=1, frames_per_batch=8, start_method="fork")


_RELEASE = threading.Event()  # module level: inline workers unpickle the env class by reference


class _HangsUntilReleased(CountingEnv):
    def step(self, action: Any) -> Any:
        _RELEASE.wait()
        return super().step(action)


async def test_a_hung_inline_worker_fails_instead_of_restarting() -> None:
    # A thread cannot be killed, so restart_workers cannot replace it: the stall is raised.
    try:
        with anyio.fail_after(60), pytest.raises(WorkerTimeoutError, match=r"^worker 0 \(pid \d+\) made no progress"):
            async with MultiAsyncCollector([_HangsUntilReleased], frames_per_batch=4, worker_timeout=0.5,
                                           restart_workers=1, shutdown_timeout=0.5, backend="inline") as c:  # fmt: skip
                await c.__anext__()
    finally:
        _RELEASE.set()  # lets the abandoned thread finish, so nothing outlives the test


def test_a_transport_that_cannot_load_is_named_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiocollect._workers as registry

    monkeypatch.setattr(registry, "TRANSPORTS", (*registry.TRANSPORTS, "mpi"))
    with pytest.raises(
        LookupError, match=r"^worker backend 'mpi' is not available: No module named 'aiocollect\._workers\._mpi'$"
    ) as info:
        MultiSyncCollector(CountingEnv, num_workers=1, frames_per_batch=8, backend="mpi")
    assert isinstance(info.value.__cause__, ImportError)


def test_every_fork_server_preload_entry_exists() -> None:
    # The fork server skips a preload entry that fails to import, silently: a renamed module
    # would only make start-up slow again. (Not imported here: _forkserver freezes the heap.)
    import importlib.util

    from aiocollect._workers._prestart import FORKSERVER_PRELOAD

    assert FORKSERVER_PRELOAD[-1] == "aiocollect._workers._forkserver"
    assert [m for m in FORKSERVER_PRELOAD if importlib.util.find_spec(m) is None] == []


async def test_inline_workers_free_their_step_views_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Threads that free thousands of small tensors at the same moment thrash (closing 64 inline
    # workers took most of a second): each worker frees its rollout's views under one lock.
    from aiocollect._rollout._rollout import Rollout
    from aiocollect._workers import _loop

    dropped: list[tuple[bool, int]] = []  # (lock held, views left) per call
    real = Rollout.drop_views

    def drop_views(self: Rollout) -> None:
        held = _loop._FREE_ONE_AT_A_TIME.locked()
        real(self)
        dropped.append((held, 0 if self._cached_views is None else len(self._cached_views)))

    monkeypatch.setattr(Rollout, "drop_views", drop_views)
    with anyio.fail_after(60):
        async with MultiSyncCollector([CountingEnv] * 4, frames_per_batch=32, backend="inline") as c:
            await c.__anext__()
            assert c._transport is not None
            threads = [t for t in c._transport._threads if t is not None]  # type: ignore[attr-defined]
        assert len(threads) == 4
        assert not any(t.is_alive() for t in threads)  # closing joined them, after the free
    assert dropped == [(True, 0)] * 4


def _torchrl_cartpole() -> Any:
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1")


async def test_a_torchrl_env_worker_thread_ends_without_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker's last step (closing its env, freeing its rollout's views) runs after the engine
    # stopped listening: an error there would only reach the thread's excepthook.
    pytest.importorskip("torchrl.envs")
    errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    with anyio.fail_after(60):
        async with MultiSyncCollector([_torchrl_cartpole] * 2, frames_per_batch=32, total_frames=64,
                                      backend="inline") as c:  # fmt: skip
            batches = [b async for b in c]
    assert len(batches) == 2
    assert errors == []

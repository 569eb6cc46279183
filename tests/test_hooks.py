"""pre_collect_hook / post_collect_hook and enable_profile, in process and in worker processes."""

from __future__ import annotations

import os
import pathlib
import threading
from typing import Any

import anyio
import pytest
import torch

from aiocollect import Collector, MultiAsyncCollector, MultiSyncCollector, ReplayBuffer, WorkerError
from aiocollect._core._profile import ProfileConfig
from aiocollect.blocking import Collector as BlockingCollector
from aiocollect.blocking import MultiSyncCollector as BlockingMultiSync
from aiocollect.testing import CountingEnv

pytestmark = pytest.mark.anyio


def counting() -> CountingEnv:
    return CountingEnv(2, episode_length=3)


class Recorder:
    """Hooks that keep what they saw (in-process collectors: same process, no pickling)."""

    def __init__(self) -> None:
        self.pre = 0
        self.batches: list[Any] = []
        self.threads: set[int] = set()

    def pre_hook(self) -> None:
        self.pre += 1
        self.threads.add(threading.get_ident())

    def post_hook(self, batch: Any) -> None:
        self.batches.append(batch)


def note(directory: str, kind: str) -> None:
    """A hook for worker processes: one file per call, named by kind and process id."""
    count = len(list(pathlib.Path(directory).glob(f"{kind}-{os.getpid()}-*")))
    (pathlib.Path(directory) / f"{kind}-{os.getpid()}-{count}").touch()


def post_note(directory: str, batch: Any) -> None:
    assert batch.batch_size.numel() > 0 and "observation" in batch.keys()
    note(directory, "post")


def listing(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def failing_hook(batch: Any) -> None:
    raise RuntimeError("hook failed")


# -- in-process ----------------------------------------------------------------------------------
async def test_hooks_are_none_by_default_and_settable() -> None:
    rec = Recorder()
    c = Collector(counting, frames_per_batch=6, total_frames=18)
    assert c.pre_collect_hook is None and c.post_collect_hook is None
    c.pre_collect_hook = rec.pre_hook
    c.set_post_collect_hook(rec.post_hook)
    assert c.pre_collect_hook == rec.pre_hook and c.post_collect_hook == rec.post_hook
    with anyio.fail_after(30):
        batches = [b async for b in c]
    assert rec.pre == len(batches) == 3
    assert all(a is b for a, b in zip(rec.batches, batches, strict=True))  # the very objects yielded
    assert threading.get_ident() not in rec.threads  # run where the envs are stepped, off the loop


async def test_post_hook_sees_the_postprocessed_batch() -> None:
    rec = Recorder()

    def postproc(batch: Any) -> Any:
        return batch.set("marked", torch.ones(batch.batch_size, dtype=torch.bool))

    with anyio.fail_after(30):
        async with Collector(
            counting, frames_per_batch=6, total_frames=12, postproc=postproc, post_collect_hook=rec.post_hook
        ) as c:
            batches = [b async for b in c]
    assert [b is r for b, r in zip(batches, rec.batches, strict=True)] == [True, True]
    assert all("marked" in b.keys() for b in rec.batches)


async def test_post_hook_sees_each_batch_before_it_is_written_to_the_buffer() -> None:
    seen: list[int] = []
    rb = ReplayBuffer(100)
    try:
        c = Collector(counting, frames_per_batch=6, total_frames=18, replay_buffer=rb,
                      post_collect_hook=lambda b: seen.append(len(rb) + b.numel()))  # fmt: skip
        with anyio.fail_after(30):
            items = [item async for item in c]
        assert items == [None] * 3
        assert seen == [6, 12, 18] and len(rb) == 18  # each one before its frames were in the buffer
    finally:
        await rb.aclose()


async def test_hook_exception_stops_collection() -> None:
    c = Collector(counting, frames_per_batch=6, total_frames=18, post_collect_hook=failing_hook)
    with anyio.fail_after(30), pytest.raises(RuntimeError, match=r"^hook failed$"):
        async for _ in c:
            pass
    assert c.stats().batches == 1


def test_a_hook_must_be_callable() -> None:
    with pytest.raises(TypeError, match=r"^post_collect_hook must be a callable or None, got 3$"):
        Collector(counting, frames_per_batch=6, post_collect_hook=3)


def test_blocking_twin_hooks() -> None:
    rec = Recorder()
    with BlockingCollector(counting, frames_per_batch=6, total_frames=12, pre_collect_hook=rec.pre_hook) as c:
        c.post_collect_hook = rec.post_hook
        assert c.post_collect_hook == rec.post_hook
        batches = list(c)
    assert rec.pre == 2 and [a is b for a, b in zip(batches, rec.batches, strict=True)] == [True, True]


# -- worker processes ------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_hooks_run_in_each_worker_process(cls: type, tmp_path: pathlib.Path) -> None:
    from functools import partial

    d = str(tmp_path)
    hooks = {"pre_collect_hook": partial(note, d, "pre"), "post_collect_hook": partial(post_note, d)}
    with anyio.fail_after(60):
        async with cls(counting, num_workers=2, frames_per_batch=12, total_frames=48, **hooks) as c:
            async for _ in c:
                pass
    calls = [name.split("-") for name in listing(tmp_path)]
    pids = {int(pid) for _, pid, _ in calls}
    assert len(pids) == 2 and os.getpid() not in pids
    assert {kind for kind, _, _ in calls} == {"pre", "post"}
    posts = sorted(sum(1 for k, p, _ in calls if k == "post" and int(p) == pid) for pid in pids)
    if cls is MultiSyncCollector:
        assert posts == [4, 4]  # one per batch of each worker
    else:
        assert sum(posts) >= 4  # each batch delivered, and those collected ahead


@pytest.mark.timeout(120)
def test_setting_hooks_reaches_running_workers(tmp_path: pathlib.Path) -> None:
    from functools import partial

    d = str(tmp_path)
    with BlockingMultiSync(counting, num_workers=2, frames_per_batch=12, total_frames=24) as c:
        assert c.pre_collect_hook is None  # the workers are running already (built by the constructor)
        c.pre_collect_hook = partial(note, d, "pre")
        c.post_collect_hook = partial(post_note, d)
        list(c)
    calls = [name.split("-") for name in listing(tmp_path)]
    assert len(calls) == 8 and len({pid for _, pid, _ in calls}) == 2 and str(os.getpid()) not in str(calls)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_worker_hook_failure_is_a_worker_error(backend: str) -> None:
    c = MultiSyncCollector(counting, num_workers=2, frames_per_batch=12, total_frames=24,
                           post_collect_hook=failing_hook, backend=backend)  # fmt: skip
    with anyio.fail_after(60), pytest.raises(WorkerError, match="hook failed") as info:
        async with c:
            async for _ in c:
                pass
    assert isinstance(info.value.__cause__, RuntimeError)


def test_unpicklable_worker_hook_is_refused_before_anything_starts() -> None:
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"^pre_collect_hook runs in the worker processes, but .* cannot be pickled"):
        MultiSyncCollector(counting, num_workers=2, frames_per_batch=12, pre_collect_hook=lambda: lock.locked())


def test_multi_collectors_refuse_worker_idx() -> None:
    with pytest.raises(TypeError, match=r"^MultiSyncCollector numbers its workers itself .*; drop worker_idx$"):
        MultiSyncCollector(counting, num_workers=2, frames_per_batch=12, worker_idx=3)


# -- profiling -------------------------------------------------------------------------------------
def test_profile_config_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match=r"^num_rollouts \(2\) must be greater than warmup_rollouts \(2\)"):
        ProfileConfig(num_rollouts=2, warmup_rollouts=2)
    with pytest.raises(ValueError, match=r"^warmup_rollouts must be >= 0, got -1$"):
        ProfileConfig(warmup_rollouts=-1)
    with pytest.raises(ValueError, match=r"^profiler activities must be 'cpu' or 'cuda', got \['tpu'\]$"):
        ProfileConfig(activities=["tpu"])


async def test_enable_profile_writes_a_trace_and_keeps_the_users_hook(tmp_path: pathlib.Path) -> None:
    rec = Recorder()
    c = Collector(counting, frames_per_batch=6, total_frames=30, post_collect_hook=rec.post_hook)
    c.enable_profile(num_rollouts=3, warmup_rollouts=1, save_path=str(tmp_path / "trace_{worker_idx}.json"),
                     activities=["cpu"])  # fmt: skip
    assert c.profile_config is not None and c.profile_config.num_rollouts == 3
    assert c.post_collect_hook is not rec.post_hook  # the profiler's, which runs after the user's
    with anyio.fail_after(60):
        async for _ in c:
            pass
    assert len(rec.batches) == 5
    assert listing(tmp_path) == ["trace_0.json"]
    c.disable_profile()
    assert c.profile_config is None and c.post_collect_hook == rec.post_hook
    with pytest.raises(RuntimeError, match=r"^Cannot enable profiling after iteration has started"):
        c.enable_profile()


@pytest.mark.timeout(120)
async def test_enable_profile_in_chosen_workers(tmp_path: pathlib.Path) -> None:
    c = MultiSyncCollector(counting, num_workers=2, frames_per_batch=12, total_frames=60)
    with pytest.raises(ValueError, match=r"^enable_profile workers must be worker indices in range\(2\), got \[2\]"):
        c.enable_profile(workers=[2])
    c.enable_profile(workers=[1], num_rollouts=3, save_path=str(tmp_path / "w{worker_idx}.json"), activities=["cpu"])
    with anyio.fail_after(60):
        async with c:
            async for _ in c:
                pass
    assert listing(tmp_path) == ["w1.json"]

"""TorchRL's ``init_fn`` and ``collector_class`` on the multi-process collectors.

``init_fn`` is process-level set-up (a simulator's app launcher, a ``sys.path`` entry) that
must run in each worker before anything else: before its env factory is even unpickled, since
unpickling may import what only works afterwards. The test for that order uses an env factory
from a module that only ``init_fn`` makes importable.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import uuid
from functools import partial
from pathlib import Path

import anyio
import pytest

import aiocollect
import aiocollect.blocking as blocking
from aiocollect import AsyncCollector, Collector, MultiAsyncCollector, MultiSyncCollector, WorkerError
from aiocollect.testing import CountingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

# The env factory's module: importable only from the directory `init_fn` puts on sys.path.
LATE_MODULE = """
import os
from pathlib import Path

from aiocollect.testing import CountingEnv

HERE = Path(__file__).parent


def make_env():
    pid = os.getpid()
    assert (HERE / f"init-{pid}").exists(), "the env factory ran before init_fn"
    (HERE / f"env-{pid}").touch()
    return CountingEnv(1, episode_length=5)
"""


def prepare_worker(directory: str) -> None:
    """The test's init_fn: make ``directory`` importable and leave a mark of this process."""
    sys.path.insert(0, directory)
    (Path(directory) / f"init-{os.getpid()}").touch()


def refuse_to_start(directory: str) -> None:
    (Path(directory) / f"init-{os.getpid()}").touch()
    raise RuntimeError("simulator app could not launch")


def marked_env(directory: str) -> CountingEnv:
    pid = os.getpid()
    assert (Path(directory) / f"init-{pid}").exists(), "the env factory ran before init_fn"
    (Path(directory) / f"env-{pid}").touch()
    return CountingEnv(1, episode_length=5)


def marks(directory: Path, kind: str) -> set[int]:
    return {int(p.name.split("-")[1]) for p in directory.glob(f"{kind}-*")}


@pytest.fixture
def late_env(tmp_path: Path):
    """An env factory pickled by reference to a module that worker processes cannot import by themselves."""
    name = f"late_env_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(LATE_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(name)
    finally:
        sys.path.remove(str(tmp_path))  # this process keeps the module; the fork server never had the path
    yield module.make_env
    del sys.modules[name]


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_init_fn_runs_first_in_each_worker_before_its_env_factory_is_unpickled(
    cls: type, late_env: object, tmp_path: Path
) -> None:
    with anyio.fail_after(60):
        # Without init_fn, a worker cannot even unpickle the env factory: the module is not on its path.
        with pytest.raises(WorkerError) as info:
            async with cls(late_env, num_workers=2, frames_per_batch=4, total_frames=4):
                pass
        assert isinstance(info.value.__cause__, ModuleNotFoundError)
        async with cls(late_env, num_workers=2, frames_per_batch=4, total_frames=8,
                       init_fn=partial(prepare_worker, str(tmp_path))) as c:  # fmt: skip
            pids = set(c._worker_pids())
            batches = [b async for b in c]
    assert len(batches) == 2
    assert len(pids) == 2 and os.getpid() not in pids
    assert marks(tmp_path, "init") == marks(tmp_path, "env") == pids  # once per worker, before its env


INLINE_CALLS: list[str] = []  # threads of this process: a module global, pickled by reference


def record_thread(directory: str) -> None:
    INLINE_CALLS.append(threading.current_thread().name)
    (Path(directory) / f"init-{os.getpid()}").touch()


async def test_init_fn_runs_in_each_inline_worker_thread(tmp_path: Path) -> None:
    INLINE_CALLS.clear()
    with anyio.fail_after(60):
        async with MultiSyncCollector(partial(marked_env, str(tmp_path)), num_workers=2, frames_per_batch=4,
                                      total_frames=4, init_fn=partial(record_thread, str(tmp_path)),
                                      backend="inline") as c:  # fmt: skip
            [b async for b in c]
    assert len(INLINE_CALLS) == 2 and len(set(INLINE_CALLS)) == 2  # once in each worker's own thread
    assert threading.current_thread().name not in INLINE_CALLS


@pytest.mark.parametrize("twin", [False, True], ids=["async", "blocking"])
async def test_an_init_fn_that_raises_fails_start_up_with_the_worker_and_its_traceback(
    twin: bool, backend: str, tmp_path: Path
) -> None:
    env, init = partial(marked_env, str(tmp_path)), partial(refuse_to_start, str(tmp_path))
    with anyio.fail_after(60):
        with pytest.raises(WorkerError) as info:
            if twin:  # the blocking twin starts its workers in the constructor (off the event loop here)
                await anyio.to_thread.run_sync(partial(blocking.AsyncCollector, env, frames_per_batch=4, init_fn=init,
                                                       backend=backend))  # fmt: skip
            else:
                async with AsyncCollector(env, frames_per_batch=4, init_fn=init, backend=backend):
                    pass
    err = info.value
    assert err.worker_id == 0
    assert "simulator app could not launch" in str(err)
    assert isinstance(err.__cause__, RuntimeError)
    assert "in refuse_to_start" in str(err.__cause__.__cause__)  # the worker's own traceback
    assert len(marks(tmp_path, "init")) == 1 and not marks(tmp_path, "env")  # nothing was built after it


async def test_a_restarted_worker_runs_init_fn_again(tmp_path: Path) -> None:
    def env() -> CountingEnv:
        return CountingEnv(0, episode_length=10**9)

    with anyio.fail_after(90):
        async with MultiSyncCollector(env, num_workers=2, frames_per_batch=20, restart_workers=1,
                                      init_fn=partial(prepare_worker, str(tmp_path))) as c:  # fmt: skip
            await c.__anext__()
            first = set(c._worker_pids())
            os.kill(c._worker_pids()[1], signal.SIGKILL)
            await c.__anext__()
            now = set(c._worker_pids())
            assert c.stats().restarts == 1
    assert len(first | now) == 3
    assert marks(tmp_path, "init") == first | now


def torchrl_collector() -> type:
    return pytest.importorskip("torchrl.collectors").Collector  # type: ignore[no-any-return]


def test_collector_class_takes_the_one_in_process_collector_by_any_of_its_names() -> None:
    for cls in (MultiSyncCollector, MultiAsyncCollector):
        for given in (None, Collector, blocking.Collector, aiocollect.SyncDataCollector, torchrl_collector()):
            cls(CountingEnv, num_workers=2, frames_per_batch=4, collector_class=given)  # starts nothing


async def test_a_torchrl_script_passing_torchrl_s_collector_class_collects() -> None:
    with anyio.fail_after(60):
        make = partial(aiocollect.MultiSyncDataCollector, [CountingEnv] * 2, frames_per_batch=4, total_frames=4)
        c = await anyio.to_thread.run_sync(partial(make, collector_class=torchrl_collector()))
        try:
            batches = await anyio.to_thread.run_sync(lambda: list(c))
        finally:
            await anyio.to_thread.run_sync(c.shutdown)
    assert [b.shape for b in batches] == [(2, 1, 2)]  # [workers, envs, time]


def _torchrl_subclass() -> type:
    class Custom(torchrl_collector()):  # type: ignore[misc]
        pass

    return Custom


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"init_fn": 3}, TypeError, r"^init_fn must be a callable taking no arguments .*, got 3$"),
        ({"init_fn": partial(id, threading.Lock())}, TypeError, r"^init_fn cannot be pickled .*_thread\.lock"),
        ({"collector_class": MultiSyncCollector}, ValueError,
         r"^collector_class=MultiSyncCollector would start worker processes inside each worker.*num_workers"),
        ({"collector_class": aiocollect.MultiaSyncDataCollector}, ValueError, r"DistributedCollector\(collector_cl"),
        ({"collector_class": "single"}, TypeError, r"^collector_class must be None or Collector .*got 'single'; drop"),
        ({"collector_class": _torchrl_subclass}, TypeError,
         r"got <class .*Custom'>: .* overrides would never run; move what it adds to postproc="),
    ],
    ids=["init_fn-not-callable", "init_fn-unpicklable", "multi-class", "multi-twin", "string", "subclass"],
)  # fmt: skip
def test_bad_init_fn_or_collector_class_fails_before_any_worker_starts(kwargs: dict, error: type, match: str) -> None:
    if kwargs.get("collector_class") is _torchrl_subclass:
        kwargs = {"collector_class": _torchrl_subclass()}
    for cls in (blocking.MultiSyncCollector, blocking.AsyncCollector):  # twins: they would start workers at once
        with pytest.raises(error, match=match):
            cls(CountingEnv, frames_per_batch=4, **({"num_workers": 2} if cls is blocking.MultiSyncCollector else {}),
                **kwargs)  # fmt: skip

"""TorchRL replay buffers fed by aiocollect's collectors exactly as TorchRL's collectors feed them.

TorchRL's multi-process workers each extend the buffer with their own ``[*env_batch, T]``
batch; ``extend_buffer=False`` is one ``rb.add`` per time step; ``trajs_per_batch`` writes
each worker's complete trajectories as flat runs of frames. `CountingEnv` frames name their
env, episode and step, so every check reads the stored frames themselves.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
import torch

pytest.importorskip("torchrl.data")

from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer

import aiocollect
from aiocollect import Collector, MultiAsyncCollector, MultiSyncCollector, MultiSyncDataCollector
from aiocollect.testing import CountingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture(scope="module", autouse=True)
def torchrl_buffer_process_state() -> None:
    """Make one TorchRL buffer before the first test's leak snapshot.

    Its shared counters (``mp.Value``) live in multiprocessing's process-wide heap arena and
    start the resource tracker: both stay for the rest of the process, whichever test is first.
    """
    ReplayBuffer(storage=LazyTensorStorage(1))
    gc.collect()


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    # A TorchRL replay buffer owns multiprocessing semaphores (in /dev/shm) that its
    # finalizer frees; collect it before the leak check looks (this runs first at teardown).
    yield
    gc.collect()


T = 8  # steps in each worker's batch
L = 5  # steps per episode
Frame = tuple[int, int, int]  # (env index, episode, step), read from a CountingEnv observation


def worker_env(w: int, num_envs: int = 0, length: int = L) -> Callable[[], CountingEnv]:
    """Worker ``w``'s env factory; its envs are numbered from ``w * max(num_envs, 1)``."""
    return functools.partial(CountingEnv, num_envs, length, first_index=w * max(num_envs, 1))


def frames(td: TensorDictBase) -> list[Frame]:
    return [(int(i), int(e), int(s)) for i, e, s in td["observation"].reshape(-1, 3).tolist()]


def steps(env: int, first: int, n: int, length: int = L) -> list[Frame]:
    """Frames ``first`` to ``first + n - 1`` of env ``env`` (which resets when an episode ends)."""
    return [(env, s // length, s % length) for s in range(first, first + n)]


def lazy_storage(kind: str, tmp_path: Any, ndim: int = 1) -> Any:
    if kind == "memmap":
        return LazyMemmapStorage(1_000, scratch_dir=tmp_path, ndim=ndim)
    return LazyTensorStorage(1_000, ndim=ndim)


def check_async_chunks(stored: list[Frame], chunk: int, per_env: int = 1) -> dict[int, int]:
    """Every ``chunk`` stored frames are one worker batch of consecutive steps; batches per worker."""
    seen: dict[int, int] = {}
    for start in range(0, len(stored), chunk):
        part = stored[start : start + chunk]
        worker = part[0][0] // per_env
        k = seen.get(worker, 0)
        assert part == steps(part[0][0], k * chunk, chunk), f"frames {start}..: {part}"
        seen[worker] = k + 1
    return seen


# -- extend_buffer=True: one extend per worker batch -------------------------------------------


@pytest.mark.parametrize("storage", ["tensor", "memmap"])
@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_multisync_extends_with_each_workers_batch_in_worker_order(
    storage: str, backend: str, tmp_path: Any
) -> None:
    rb = ReplayBuffer(storage=lazy_storage(storage, tmp_path), batch_size=4)
    lengths = []
    with anyio.fail_after(50):
        async with MultiSyncCollector(
            [worker_env(0), worker_env(1)], frames_per_batch=2 * T, total_frames=6 * T, replay_buffer=rb,
            backend=backend,
        ) as c:  # fmt: skip
            async for item in c:
                assert item is None
                lengths.append(len(rb))
    assert lengths == [2 * T, 4 * T, 6 * T]  # 2 workers x T transitions per batch, not 2 stacked entries
    expected = [f for b in range(3) for w in range(2) for f in steps(w, b * T, T)]
    assert frames(rb[:]) == expected  # worker 0's batch, then worker 1's, batch after batch


async def test_multisync_buffer_holds_the_frames_it_would_have_yielded() -> None:
    keys = ["observation", ("next", "observation"), ("next", "reward"), ("next", "done"), ("collector", "traj_ids")]
    kwargs: dict[str, Any] = {"frames_per_batch": 2 * T, "total_frames": 4 * T, "backend": "inline"}
    with anyio.fail_after(50):
        async with MultiSyncCollector([worker_env(0), worker_env(1)], **kwargs) as c:
            yielded = [b async for b in c]
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100))
        async with MultiSyncCollector([worker_env(0), worker_env(1)], replay_buffer=rb, **kwargs) as c:
            _ = [b async for b in c]
    stored = rb[:]
    flat: Any = torch.cat([b[w] for b in yielded for w in range(2)], 0)  # [W, T] batches, worker by worker
    for key in keys:
        assert torch.equal(stored[key], flat[key]), key


@pytest.mark.parametrize("storage", ["tensor", "memmap"])
async def test_multiasync_extends_with_the_delivering_workers_batch(storage: str, tmp_path: Any) -> None:
    rb = ReplayBuffer(storage=lazy_storage(storage, tmp_path), batch_size=4)
    lengths = []
    with anyio.fail_after(50):
        async with MultiAsyncCollector(
            [worker_env(0), worker_env(1)], frames_per_batch=T, total_frames=6 * T, replay_buffer=rb,
            backend="inline",
        ) as c:  # fmt: skip
            async for item in c:
                assert item is None
                lengths.append(len(rb))
    assert lengths == [T * k for k in range(1, 7)]
    seen = check_async_chunks(frames(rb[:]), T)
    assert sum(seen.values()) == 6


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_batched_envs_extend_2d_storage_along_time_batch_by_batch(cls: type) -> None:
    # A TorchRL ndim=2 storage keeps one row per env of the batch and extends rows along time:
    # each worker's [2, T] batch adds T steps to both rows, as TorchRL's workers write it.
    rb = ReplayBuffer(storage=LazyTensorStorage(200, ndim=2))
    n_batches = 3
    fpb = 2 * 2 * T if cls is MultiSyncCollector else 2 * T  # 2 envs per worker
    with anyio.fail_after(50):
        async with cls([worker_env(0, 2), worker_env(1, 2)], frames_per_batch=fpb,
                       total_frames=n_batches * fpb, replay_buffer=rb, backend="inline") as c:  # fmt: skip
            _ = [b async for b in c]
    stored = rb[:]
    assert len(rb) == n_batches * fpb and stored.shape == (2, n_batches * fpb // 2)
    rows = [frames(row) for row in stored]
    if cls is MultiSyncCollector:  # per batch: worker 0's T steps, then worker 1's
        for e in range(2):
            assert rows[e] == [f for b in range(n_batches) for w in range(2) for f in steps(2 * w + e, b * T, T)]
    else:  # per batch: the delivering worker's T steps, in both rows
        seen = check_async_chunks(rows[0], T, per_env=2)
        assert sum(seen.values()) == n_batches
        assert [(i + 1, ep, st) for i, ep, st in rows[0]] == rows[1]


async def test_batched_envs_fill_1d_storage_with_one_entry_per_env_row() -> None:
    # TorchRL's worker extends with its [B, T] batch: an ndim=1 storage takes B entries of T frames.
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    with anyio.fail_after(50):
        async with MultiSyncCollector([worker_env(0, 2), worker_env(1, 2)], frames_per_batch=4 * T,
                                      total_frames=4 * T, replay_buffer=rb, backend="inline") as c:  # fmt: skip
            _ = [b async for b in c]
    assert len(rb) == 4 and rb[:].shape == (4, T)
    assert [frames(row) for row in rb[:]] == [steps(env, 0, T) for env in range(4)]


def test_classic_blocking_multisync_fills_a_torchrl_buffer() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(256), batch_size=5)
    with MultiSyncDataCollector([worker_env(0), worker_env(1)], frames_per_batch=2 * T, total_frames=4 * T,
                                replay_buffer=rb, backend="inline") as c:  # fmt: skip
        for k, item in enumerate(c, start=1):
            assert item is None and len(rb) == 2 * T * k
    assert rb.sample().shape == (5,)


# -- extend_buffer=False: one add per time step ------------------------------------------------


async def test_per_step_writes_of_an_unbatched_env_add_one_frame_each() -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    with anyio.fail_after(30):
        async with Collector(CountingEnv(0), frames_per_batch=T, total_frames=2 * T, replay_buffer=rb,
                             extend_buffer=False) as c:  # fmt: skip
            items = [b async for b in c]
    assert items == [None, None]
    assert len(rb) == 2 * T and frames(rb[:]) == steps(0, 0, 2 * T)


@pytest.mark.filterwarnings("ignore:Using `add\\(\\)` with a TensorDict that has batch_size:UserWarning")
async def test_per_step_writes_of_a_batched_env_add_one_entry_per_step() -> None:
    # TorchRL's add() warns about a batched entry (its own collector's writes do the same).
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    with anyio.fail_after(30):
        async with Collector(CountingEnv(2), frames_per_batch=2 * T, total_frames=2 * T, replay_buffer=rb,
                             extend_buffer=False) as c:  # fmt: skip
            _ = [b async for b in c]
    assert len(rb) == T  # TorchRL's add(): each step's [2] frames are one entry
    stored = rb[:]
    assert stored.shape == (T, 2)
    assert [frames(step) for step in stored] == [steps(0, t, 1) + steps(1, t, 1) for t in range(T)]


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_multi_collectors_add_each_workers_steps(cls: type) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(200))
    fpb = 2 * T if cls is MultiSyncCollector else T
    lengths = []
    with anyio.fail_after(50):
        async with cls([worker_env(0), worker_env(1)], frames_per_batch=fpb, total_frames=4 * T,
                       replay_buffer=rb, extend_buffer=False, backend="inline") as c:  # fmt: skip
            async for item in c:
                assert item is None
                lengths.append(len(rb))
    assert lengths == [fpb * k for k in range(1, len(lengths) + 1)] and lengths[-1] == 4 * T
    stored = frames(rb[:])
    if cls is MultiSyncCollector:
        assert stored == [f for b in range(2) for w in range(2) for f in steps(w, b * T, T)]
    else:
        check_async_chunks(stored, T)


# -- postproc ----------------------------------------------------------------------------------


def zeros(td: TensorDictBase) -> TensorDictBase:
    return torch.zeros_like(td)


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize("buffer", ["torchrl", "aiocollect"])
async def test_postproc_applies_to_whole_batch_writes(cls: type, buffer: str) -> None:
    rb: Any = ReplayBuffer(storage=LazyTensorStorage(200)) if buffer == "torchrl" else aiocollect.ReplayBuffer(200)
    shapes = []

    def postproc(td: TensorDictBase) -> TensorDictBase:
        shapes.append(tuple(td.shape))
        return zeros(td)

    env: Any = CountingEnv(0) if cls is Collector else [worker_env(0), worker_env(1)]
    extra = {} if cls is Collector else {"backend": "inline"}
    fpb = T if cls is not MultiSyncCollector else 2 * T
    with anyio.fail_after(50):
        async with cls(env, frames_per_batch=fpb, total_frames=4 * T, replay_buffer=rb, postproc=postproc,
                       **extra) as c:  # fmt: skip
            _ = [b async for b in c]
    if buffer == "torchrl":
        stored = rb[:]
        assert len(rb) == 4 * T
        assert set(shapes) == {(T,)}  # each worker's own batch, as TorchRL's workers post-process
    else:
        stored = {k: v[: rb.write_count] for k, v in rb.storage.tensors.items()}
        assert rb.write_count == 4 * T
    for key in ("observation", "action", ("next", "reward"), ("next", "observation")):
        assert (stored[key] == 0).all(), key


async def test_per_step_writes_take_no_postproc() -> None:
    with pytest.raises(ValueError, match=r"^extend_buffer=False writes frames into the buffer step by step"):
        MultiSyncCollector([worker_env(0)], frames_per_batch=T, replay_buffer=ReplayBuffer(), extend_buffer=False,
                           postproc=zeros)  # fmt: skip


async def test_writes_carry_the_storages_device_when_postproc_drops_it() -> None:
    devices = []

    class Recording(ReplayBuffer):
        def extend(self, data: TensorDictBase, *args: Any, **kwargs: Any) -> Any:
            devices.append(data.device)
            return super().extend(data, *args, **kwargs)

    rb = Recording(storage=LazyTensorStorage(100, device="cpu"))

    def no_device(td: TensorDictBase) -> TensorDictBase:
        return td.clone().clear_device_()

    with anyio.fail_after(50):
        async with MultiAsyncCollector([worker_env(0), worker_env(1)], frames_per_batch=T, total_frames=2 * T,
                                       replay_buffer=rb, postproc=no_device, backend="inline") as c:  # fmt: skip
            _ = [b async for b in c]
    assert devices == [torch.device("cpu")] * 2
    assert rb[:].device == torch.device("cpu")


# -- background collection ---------------------------------------------------------------------


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_start_fills_a_torchrl_buffer_per_worker_batch(cls: type) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(200), batch_size=4)
    fpb = 2 * T if cls is MultiSyncCollector else T
    with anyio.fail_after(50):
        async with cls([worker_env(0), worker_env(1)], frames_per_batch=fpb, total_frames=6 * T, replay_buffer=rb,
                       backend="subprocess") as c:  # fmt: skip
            c.start()
            await c.wait_finished()
            await c.async_shutdown()
    assert len(rb) == 6 * T
    stored = frames(rb[:])
    if cls is MultiSyncCollector:
        assert stored == [f for b in range(3) for w in range(2) for f in steps(w, b * T, T)]
    else:
        assert sum(check_async_chunks(stored, T).values()) == 6


# -- trajectories ------------------------------------------------------------------------------


def episodes(stored: list[Frame]) -> list[list[Frame]]:
    """The stored frames cut where a step number does not follow the previous frame's."""
    out: list[list[Frame]] = []
    for f in stored:
        if out and out[-1][-1][:2] == f[:2] and out[-1][-1][2] + 1 == f[2]:
            out[-1].append(f)
        else:
            out.append([f])
    return out


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_trajectories_are_written_whole_and_each_from_one_worker(cls: type) -> None:
    rb = ReplayBuffer(storage=LazyTensorStorage(400))
    with anyio.fail_after(50):
        async with cls([worker_env(0), worker_env(1)], frames_per_batch=2 * 3 if cls is MultiSyncCollector else 3,
                       total_frames=60, trajs_per_batch=2, replay_buffer=rb, backend="inline") as c:  # fmt: skip
            _ = [b async for b in c]
    stored = frames(rb[:])
    assert stored and all(ep == steps(ep[0][0], ep[0][1] * L, L) for ep in episodes(stored))  # whole, one env
    assert rb[:]["next", "done"][-1].all()


async def test_multiasync_trajectories_never_join_two_workers_episodes() -> None:
    rb = aiocollect.ReplayBuffer(400)
    with anyio.fail_after(50):
        async with MultiAsyncCollector([worker_env(0), worker_env(1)], frames_per_batch=3, total_frames=60,
                                       trajs_per_batch=2, traj_format="cat", backend="inline") as c:  # fmt: skip
            yielded = [frames(b) async for b in c]
        async with MultiAsyncCollector([worker_env(0), worker_env(1)], frames_per_batch=3, total_frames=60,
                                       trajs_per_batch=1, replay_buffer=rb, backend="inline") as c:  # fmt: skip
            _ = [b async for b in c]
    written = frames(TensorDict(observation=rb.storage.tensors["observation"][: rb.write_count]))
    for stored in (*yielded, written):
        eps = episodes(stored)
        assert eps and all(ep == steps(ep[0][0], ep[0][1] * L, L) for ep in eps), stored


@pytest.mark.parametrize(("per_write", "sizes"), [(None, [3 * 2] * 4), (2, [2 * 2, 2] * 4)])
async def test_trajectory_writes_group_like_torchrl(per_write: int | None, sizes: list[int]) -> None:
    sizes_seen = []

    class Recording(ReplayBuffer):
        def extend(self, data: TensorDictBase, *args: Any, **kwargs: Any) -> Any:
            sizes_seen.append(data.shape[0])
            return super().extend(data, *args, **kwargs)

    rb = Recording(storage=LazyTensorStorage(100))
    # Episodes of 2 steps, batches of 6: every batch completes 3 trajectories, all written at
    # once by default, trajs_per_write at a time (the remainder too) otherwise.
    with anyio.fail_after(30):
        async with Collector(CountingEnv(0, 2), frames_per_batch=6, total_frames=24, trajs_per_batch=1,
                             trajs_per_write=per_write, replay_buffer=rb) as c:  # fmt: skip
            items = [b async for b in c]
    assert items == [None] * 4
    assert sizes_seen == sizes
    assert frames(rb[:]) == steps(0, 0, 24, length=2)


# -- arguments -----------------------------------------------------------------------------------


async def test_multiasync_accepts_torchrls_default_cat_results() -> None:
    for value in (None, "stack"):
        c = MultiAsyncCollector([worker_env(0)], frames_per_batch=T, total_frames=T, cat_results=value,
                                backend="inline")  # fmt: skip
        with anyio.fail_after(30):
            async with c:
                assert [b.shape async for b in c] == [(T,)]
    with pytest.raises(ValueError, match=r"^cat_results is only for MultiSyncCollector .*got 0; drop cat_results$"):
        MultiAsyncCollector([worker_env(0)], frames_per_batch=T, cat_results=0)


async def test_preempted_steps_are_not_written() -> None:
    c = MultiSyncCollector([worker_env(0), worker_env(1)], frames_per_batch=2 * T, preemptive_threshold=0.5,
                           replay_buffer=ReplayBuffer(), backend="inline")  # fmt: skip
    version = torch.tensor([[0] * T, [0] * 3 + [-1] * (T - 3)])  # worker 1 was stopped after 3 steps
    views = [TensorDict({("collector", "policy_version"): v, "x": torch.arange(T)}, [T]) for v in version]
    parts = c._worker_parts(views)
    assert [p["x"].tolist() for p in parts] == [list(range(T)), [0, 1, 2]]
    empty = TensorDict({("collector", "policy_version"): torch.full((T,), -1), "x": torch.arange(T)}, [T])
    assert c._worker_parts([empty]) == []

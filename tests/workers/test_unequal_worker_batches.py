"""Workers asked for different frames_per_batch: their batches stack lazily and count in full."""

from __future__ import annotations

import anyio
import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from aiocollect import MultiSyncCollector, ReplayBuffer
from aiocollect._core._ragged import frame_count
from aiocollect.testing import CountingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def counting() -> CountingEnv:
    return CountingEnv(2, episode_length=3)


@pytest.mark.parametrize("preempt", [None, 0.5])
async def test_per_worker_frames_count_every_frame_of_the_budget(backend: str, preempt: float | None) -> None:
    # 4 + 12 frames a batch: a 48-frame budget is 3 batches, not 48 (a [2, -1] stack's numel is 1).
    with anyio.fail_after(60):
        async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=[4, 12], total_frames=48,
                                      preemptive_threshold=preempt, backend=backend) as c:  # fmt: skip
            batches = [b async for b in c]
            stats = c.stats()
    if preempt is None:
        assert len(batches) == 3
        for b in batches:
            assert isinstance(b, LazyStackedTensorDict)
            assert [part.batch_size for part in b.tensordicts] == [(2, 2), (2, 6)]
    assert sum(frame_count(b, taken_only=preempt is not None) for b in batches) == stats["frames"]
    assert stats["frames"] >= 48 and stats["completed"]
    assert stats["frames"] - 48 < 16  # the budget ends within the batch that spent it


def test_frame_count_of_lazy_and_dense_batches() -> None:
    parts = [TensorDict({"x": torch.zeros(1, 4)}, [1, 4]), TensorDict({"x": torch.zeros(2, 2)}, [2, 2])]
    lazy = LazyStackedTensorDict.lazy_stack(parts, 0)
    assert lazy.numel() != 8  # why frame_count exists
    assert frame_count(lazy) == 8
    assert frame_count(torch.stack([parts[1], parts[1]], 0)) == 8
    # A preempted worker's steps not taken have policy version -1.
    for part, versions in zip(parts, [torch.tensor([[0, 0, -1, -1]]), torch.zeros(2, 2)], strict=True):
        part["collector", "policy_version"] = versions
    assert frame_count(LazyStackedTensorDict.lazy_stack(parts, 0), taken_only=True) == 6


async def test_per_worker_frames_split_into_trajectories(backend: str) -> None:
    with anyio.fail_after(60):
        async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=[4, 12], total_frames=16,
                                      split_trajs=True, backend=backend) as c:  # fmt: skip
            (batch,) = [b async for b in c]
    mask = batch["collector", "mask"]
    assert int(mask.sum()) == 16  # every frame once, in one padded [n_traj, max_len] batch
    assert batch.shape[1] == 3  # CountingEnv's episodes last 3 steps
    ids = batch["collector", "traj_ids"][:, 0]
    assert ids.unique().numel() == ids.numel()  # no trajectory split across rows


@pytest.mark.parametrize(("cat", "shape"), [(-1, (2, 8)), (1, (2, 8))])
async def test_per_worker_frames_concatenate_along_time(cat: int, shape: tuple[int, int], backend: str) -> None:
    with anyio.fail_after(60):
        async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=[4, 12], total_frames=16,
                                      cat_results=cat, backend=backend) as c:  # fmt: skip
            (batch,) = [b async for b in c]
    assert batch.shape == shape


@pytest.mark.parametrize(
    ("cat", "message"),
    [
        (0, r"^cat_results=0 concatenates the workers' batches along dim 0, which needs their other dims to match, "
            r"got shapes \[2, 2\], \[2, 6\] \(.*\): use cat_results=-1 \(the time dim\) or 'stack'$"),
        (2, r"^cat_results=2 is not a dim of the workers' batches \(shape \[2, 2\]: dims -2 to 1\)"),
    ],
)  # fmt: skip
async def test_a_dim_the_batches_cannot_be_joined_along_is_named(cat: int, message: str, backend: str) -> None:
    with anyio.fail_after(60):
        async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=[4, 12], total_frames=16,
                                      cat_results=cat, backend=backend) as c:  # fmt: skip
            with pytest.raises(ValueError, match=message):
                await c.__anext__()


def ident(batch: TensorDictBase) -> TensorDictBase:
    return batch


@pytest.mark.parametrize(
    "extra",
    [{"extend_buffer": False}, {"postproc": ident}, {"storing_device": "cpu"}],
    ids=["step-by-step", "postproc", "storing_device"],
)
async def test_per_worker_frames_reach_a_buffer_the_parent_writes(backend: str, extra: dict[str, object]) -> None:
    # These buffers are written by the parent, not the workers: every frame must land there
    # (extend_buffer=False wrote none of them: a ragged batch has no last dim to step along).
    rb = ReplayBuffer(1000)
    try:
        with anyio.fail_after(60):
            async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=[4, 12], total_frames=32,
                                          replay_buffer=rb, backend=backend, **extra) as c:  # fmt: skip
                async for _ in c:
                    pass
        assert len(rb) == c.stats()["frames"] == 32
        # Every (env, episode, step) once: 2 workers x 2 envs, 4 and 12 steps a batch, 2 batches.
        obs = rb.storage.tensors["observation"][: rb.write_count].long()
        seen = {
            tuple(row)
            for row in torch.cat([rb.storage.tensors["collector", "worker_id"][:32, None].long(), obs], 1).tolist()
        }
        assert len(seen) == 32
    finally:
        await rb.aclose()


async def test_per_worker_frames_assemble_whole_trajectories(backend: str) -> None:
    # Each worker's envs continue their episodes in the same rows of its next part: the
    # assembler must not mix worker 0's row 0 with worker 1's.
    with anyio.fail_after(60):
        async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=[4, 12], total_frames=64,
                                      trajs_per_batch=4, traj_format="cat", backend=backend) as c:  # fmt: skip
            batches = [b async for b in c]
    assert batches
    for b in batches:
        ids = b["collector", "traj_ids"]
        for traj in ids.unique():
            frames = b[ids == traj]
            assert frames["collector", "worker_id"].unique().numel() == 1
            assert frames["observation"][:, 2].tolist() == [0.0, 1.0, 2.0]  # one whole 3-step episode
            assert frames["observation"][:, :2].unique(dim=0).shape[0] == 1  # one env, one episode


async def test_per_worker_frames_write_whole_trajectories_to_a_buffer(backend: str) -> None:
    rb = ReplayBuffer(1000)
    try:
        with anyio.fail_after(60):
            async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=[4, 12], total_frames=32,
                                          trajs_per_batch=2, replay_buffer=rb, backend=backend) as c:  # fmt: skip
                async for _ in c:
                    pass
        steps = rb.storage.tensors["observation"][: rb.write_count, 2].tolist()
        assert steps and steps == [0.0, 1.0, 2.0] * (len(steps) // 3)  # whole episodes, one after another
    finally:
        await rb.aclose()


async def test_the_users_own_buffer_takes_the_ragged_batches(backend: str) -> None:
    # A trainer that extends its buffer with each batch, as TorchRL scripts do.
    rb = ReplayBuffer(1000)
    try:
        with anyio.fail_after(60):
            async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=[4, 12], total_frames=32,
                                          backend=backend) as c:  # fmt: skip
                async for batch in c:
                    await rb.extend(batch)
        assert len(rb) == c.stats()["frames"] == 32
        stored = rb[:]
        seen = {
            tuple(row)
            for row in torch.cat([stored["collector", "worker_id"][:, None], stored["observation"].long()], 1).tolist()
        }
        assert len(seen) == 32  # every (worker, env, episode, step) once
    finally:
        await rb.aclose()

"""`ReplayBuffer.extend` of ragged batches: lazy stacks of parts with unequal shapes.

``MultiSyncCollector(frames_per_batch=[4, 12])`` (or nodes with different env batch sizes)
gives such batches, e.g. ``[2, 2, -1]``; a user who extends a buffer with them must get
every frame once, in the order the parts are read.
"""

from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from aiocollect import ReplayBuffer, SharedMemoryStorage, blocking

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def part(first: int, shape: tuple[int, ...]) -> TensorDict:
    """Frames numbered from ``first`` in row-major order, at the root and nested."""
    n = int(torch.Size(shape).numel())
    obs = torch.arange(first, first + n, dtype=torch.float32).reshape(*shape, 1)
    nested = TensorDict(x=torch.arange(first, first + n).reshape(*shape, 1).expand(*shape, 2), batch_size=shape)
    return TensorDict(observation=obs, nested=nested, batch_size=shape)


def ragged(*parts: TensorDict) -> LazyStackedTensorDict:
    return LazyStackedTensorDict.lazy_stack(list(parts), 0)


def numbers(*parts: TensorDict) -> list[float]:
    return torch.cat([p["observation"].reshape(-1) for p in parts]).tolist()


async def test_a_ragged_batch_is_stored_part_after_part() -> None:
    a, b = part(0, (2, 4)), part(100, (2, 12))
    batch = ragged(a, b)
    assert batch.batch_size == (2, 2, -1)  # numel() is 1 here: not a frame count
    rb = ReplayBuffer(100)
    index = await rb.extend(batch)
    assert index.tolist() == list(range(32)) and len(rb) == rb.write_count == 32
    stored = rb[:]
    assert stored["observation"].reshape(-1).tolist() == numbers(a, b)
    assert torch.equal(stored["nested", "x"][:, 0], stored["observation"][:, 0].long())
    assert rb.extend_nowait(batch).tolist() == list(range(32, 64))
    assert rb[32:]["observation"].reshape(-1).tolist() == numbers(a, b)


async def test_a_ragged_batch_of_dense_lazy_parts_is_stored_in_order() -> None:
    # Each worker's part may itself be a (dense) lazy stack of its envs.
    a = ragged(part(0, (4,)), part(4, (4,)))
    b = ragged(part(100, (12,)), part(112, (12,)))
    rb = ReplayBuffer(100)
    await rb.extend(ragged(a, b))
    assert rb[:]["observation"].reshape(-1).tolist() == [*range(8), *range(100, 124)]


async def test_ragged_rows_of_one_time_length_fill_ndim2_rows() -> None:
    # Nodes with one and two envs: parts [1, 5] and [2, 5] are three rows of 5 steps.
    a, b = part(0, (1, 5)), part(100, (2, 5))
    rb = ReplayBuffer(30, storage=SharedMemoryStorage(ndim=2))
    try:
        await rb.extend(ragged(a, b))
        assert rb.storage.row_length == 5 and len(rb) == 15
        rows = rb.storage.tensors["observation"].view(6, 5)[:3]
        assert rows.reshape(-1).tolist() == numbers(a, b)
    finally:
        await rb.aclose()


async def test_ragged_rows_of_different_lengths_are_refused_by_ndim2_storage() -> None:
    rb = ReplayBuffer(100, storage=SharedMemoryStorage(ndim=2))
    try:
        with pytest.raises(
            ValueError,
            match=r"^rows of one time length cannot hold the parts of this ragged batch "
            r"\(shapes \[\[2, 4\], \[2, 12\]\]\); extend with one part at a time, or store frames \(ndim=1\)$",
        ):
            await rb.extend(ragged(part(0, (2, 4)), part(100, (2, 12))))
        assert len(rb) == rb.write_count == 0 and not rb.storage.built  # refused before anything is allocated
        await rb.extend(part(0, (2, 4)))  # one part at a time works
        assert len(rb) == 8
    finally:
        await rb.aclose()


def test_the_blocking_twin_stores_a_ragged_batch() -> None:
    a, b = part(0, (2, 2)), part(50, (2, 6))
    rb = blocking.ReplayBuffer(100)
    try:
        rb.extend(ragged(a, b))
        assert len(rb) == 16
        assert rb[:]["observation"].reshape(-1).tolist() == numbers(a, b)
    finally:
        rb.close()

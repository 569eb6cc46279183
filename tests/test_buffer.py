"""ReplayBuffer: ring storage, waits, rate limiting, persistence, errors (no processes)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import torch
from tensordict import TensorDict

from aiocollect import (
    BufferClosedError,
    BufferEmptyError,
    MemmapStorage,
    MemoryStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SamplerWithoutReplacement,
    SharedMemoryStorage,
    SliceSampler,
    WouldBlock,
    blocking,
    split_trajectories,
)

pytestmark = pytest.mark.timeout(60)


def frames(start: int, n: int, *, traj: int = 0) -> TensorDict:
    """``n`` frames whose observation is their global number ``start + i``."""
    obs = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(
        {"observation": obs.unsqueeze(-1), ("next", "reward"): obs.unsqueeze(-1) * 2,
         ("collector", "traj_ids"): torch.full((n,), traj, dtype=torch.int64)},
        batch_size=[n],
    )  # fmt: skip


def stored(rb: ReplayBuffer) -> list[int]:
    valid = rb._valid
    return sorted(int(x) for x in rb.storage.tensors["observation"][valid, 0])


@pytest.mark.anyio
async def test_extend_then_sample_returns_stored_frames_with_index() -> None:
    rb = ReplayBuffer(100, batch_size=16, seed=0)
    index = await rb.extend(frames(0, 30))
    assert index.tolist() == list(range(30))
    assert len(rb) == 30 and rb.write_count == 30
    batch = await rb.sample()
    assert batch.shape == (16,)
    # every sampled frame is the one stored at its index, nested keys included
    assert torch.equal(batch["observation"][:, 0], batch["index"].float())
    assert torch.equal(batch["next", "reward"], batch["observation"] * 2)


@pytest.mark.anyio
async def test_ring_overwrites_oldest_frames_first() -> None:
    rb = ReplayBuffer(10, seed=0)
    for start in range(0, 24, 4):  # 24 frames into 10 rows: the last 10 survive
        await rb.extend(frames(start, 4))
    assert stored(rb) == list(range(14, 24))
    # rows hold them in ring order: frame k sits at row k % 10
    obs = rb.storage.tensors["observation"][:, 0]
    assert all(int(obs[k % 10]) == k for k in range(14, 24))
    assert rb.write_count == 24 and len(rb) == 10


@pytest.mark.anyio
async def test_ndim2_keeps_env_time_rows_whole() -> None:
    rb = ReplayBuffer(25, storage=SharedMemoryStorage(ndim=2), seed=0)
    batch = TensorDict(observation=torch.arange(12.0).reshape(3, 4, 1), batch_size=[3, 4])
    await rb.extend(batch)
    assert rb.storage.capacity == 24 and rb.storage.row_length == 4  # rounded down to whole rows
    rows = rb.storage.tensors["observation"].view(6, 4)
    assert torch.equal(rows[:3], torch.arange(12.0).reshape(3, 4))
    with pytest.raises(ValueError, match=r"^an ndim=2 buffer stores \[\.\.\., time\] rollouts"):
        await rb.extend(TensorDict(observation=torch.zeros(1), batch_size=[]))
    with pytest.raises(ValueError, match=r"^this ndim=2 buffer stores rows of 4 steps, got a batch with 3"):
        await rb.extend(TensorDict(observation=torch.zeros(2, 3, 1), batch_size=[2, 3]))
    with pytest.raises(ValueError, match=r"^wait_for\(25\) can never return: the buffer holds at most 24 frames"):
        await rb.wait_for(25)


@pytest.mark.anyio
async def test_layout_mismatch_is_refused_with_the_key() -> None:
    rb = ReplayBuffer(100)
    await rb.extend(frames(0, 4))
    with pytest.raises(ValueError, match=r"^batch is missing the key \('next', 'reward'\)"):
        await rb.extend(TensorDict(observation=torch.zeros(2, 1), batch_size=[2]))
    bad = frames(0, 2)
    bad["observation"] = bad["observation"].double()
    with pytest.raises(ValueError, match=r"^batch entry 'observation' has frame shape \(1,\) and dtype torch.float64"):
        await rb.extend(bad)
    extra = frames(0, 2)
    extra["other"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"^batch has entries \['other'\] the buffer does not store"):
        await rb.extend(extra)
    with pytest.raises(ValueError, match=r"^a batch of 200 frames does not fit in a buffer of 100 frames"):
        await rb.extend(frames(0, 200))
    assert rb.write_count == 4  # nothing partial was written


@pytest.mark.anyio
async def test_sample_waits_for_min_size_then_returns() -> None:
    rb = ReplayBuffer(100, batch_size=4, min_size=10)
    got: list[TensorDict] = []

    async def learner() -> None:
        got.append(await rb.sample())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(learner)
            await anyio.wait_all_tasks_blocked()
            await rb.extend(frames(0, 6))
            await anyio.wait_all_tasks_blocked()
            assert not got  # 6 < min_size: still waiting
            await rb.extend(frames(6, 6))
    assert got[0].shape == (4,)
    assert rb.stats().sample_wait_seconds > 0


@pytest.mark.anyio
async def test_wait_seconds_count_only_waiting_not_the_loop_running_other_tasks() -> None:
    rb = ReplayBuffer(1000, batch_size=4, seed=0)
    done = False

    async def busy() -> None:  # another task that holds the loop ~2 ms at each turn
        while not done:
            deadline = time.perf_counter() + 0.002
            while time.perf_counter() < deadline:
                pass
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(busy)
            for i in range(25):  # neither call ever has to wait ...
                await rb.extend(frames(4 * i, 4))
                await rb.sample()
            done = True
    stats = rb.stats()
    assert stats.sample_count == 100  # ... though each yielded to busy() once (~50 ms each side)
    assert stats.sample_wait_seconds == 0.0 and stats.insert_wait_seconds == 0.0


@pytest.mark.anyio
async def test_a_real_wait_is_counted_in_full() -> None:
    rb = ReplayBuffer(100, batch_size=4, min_size=10)
    got: list[TensorDict] = []

    async def learner() -> None:
        got.append(await rb.sample())

    start = time.perf_counter()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(learner)
            await anyio.wait_all_tasks_blocked()
            blocked = time.perf_counter()  # the learner is waiting for min_size by now
            await rb.extend(frames(0, 6))
            await anyio.wait_all_tasks_blocked()
            released = time.perf_counter()  # it still waits: 6 < min_size
            await rb.extend(frames(6, 6))
    waited = rb.stats().sample_wait_seconds
    assert len(got) == 1 and released - blocked <= waited <= time.perf_counter() - start


@pytest.mark.anyio
async def test_sample_nowait_never_waits() -> None:
    rb = ReplayBuffer(100, batch_size=4, samples_per_insert=1.0, tolerance=4)
    with pytest.raises(
        BufferEmptyError, match=r"^sample\(\) called on a buffer holding 0 frames .*await buffer\.wait_for\(1\) first$"
    ):
        rb.sample_nowait()
    await rb.extend(frames(0, 4))
    rb.sample_nowait()
    rb.sample_nowait()  # 8 sampled for 4 inserted: now ahead by the whole tolerance
    with pytest.raises(WouldBlock, match=r"^sample_nowait\(\) would wait"):
        rb.sample_nowait()


@pytest.mark.anyio
@pytest.mark.parametrize("fast", ["collector", "learner"])
async def test_rate_limiter_keeps_samples_per_insert_within_tolerance(fast: str) -> None:
    spi, tol, insert, draw = 2.0, 32.0, 8, 8
    rb = ReplayBuffer(10_000, batch_size=draw, min_size=16, samples_per_insert=spi, tolerance=tol, seed=0)
    worst = [0.0, 0.0]

    def check() -> None:
        s = rb.stats()
        if s.write_count >= rb.min_size:
            d = spi * (s.write_count - rb.min_size) - s.sample_count
            worst[0], worst[1] = min(worst[0], d), max(worst[1], d)

    async def collector() -> None:
        for i in range(60):
            await rb.extend(frames(i * insert, insert))
            check()
            if fast == "learner":
                await anyio.lowlevel.checkpoint()

    async def learner() -> None:
        for _ in range(116):  # 116 * 8 = spi * (480 - min_size): both sides finish
            await rb.sample()
            check()
            if fast == "collector":
                await anyio.lowlevel.checkpoint()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(collector)
            tg.start_soon(learner)
    # Each call is checked before it runs, so one call can overshoot by its own size.
    assert -tol - draw <= worst[0] and worst[1] <= tol + spi * insert
    stats = rb.stats()
    assert stats.samples_per_insert == pytest.approx(spi)
    waited = stats.insert_wait_seconds if fast == "collector" else stats.sample_wait_seconds
    assert waited > 0  # the fast side really was held back


@pytest.mark.anyio
async def test_state_dict_round_trip_restores_frames_and_sampler() -> None:
    rb = ReplayBuffer(20, batch_size=5, sampler=SamplerWithoutReplacement(), seed=3)
    for start in range(0, 28, 7):
        await rb.extend(frames(start, 7))
    await rb.sample()
    state = rb.state_dict()
    copy = ReplayBuffer(20, batch_size=5, sampler=SamplerWithoutReplacement(), seed=99)
    copy.load_state_dict(state)
    assert stored(copy) == stored(rb) and copy.write_count == rb.write_count
    for _ in range(6):  # the same epoch position and RNG state: the same samples
        a, b = await rb.sample(), await copy.sample()
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["observation"], b["observation"])


@pytest.mark.anyio
async def test_memmap_dumps_loads_round_trip(tmp_path: Path) -> None:
    rb = ReplayBuffer(50, batch_size=8, storage=MemmapStorage(tmp_path / "scratch"), seed=1)
    for start in range(0, 70, 10):
        await rb.extend(frames(start, 10))
    assert os.listdir(tmp_path / "scratch")  # one file per key
    rb.dumps(str(tmp_path / "saved"))
    restored = ReplayBuffer(50, batch_size=8, storage="memmap", seed=5)
    restored.loads(str(tmp_path / "saved"))
    assert stored(restored) == stored(rb) == list(range(20, 70))
    a, b = await rb.sample(), await restored.sample()
    assert torch.equal(a["index"], b["index"])
    scratch = Path(restored.storage.path)
    await restored.aclose()
    assert not await anyio.Path(scratch).exists()  # a temporary directory is removed on close
    with pytest.raises(FileNotFoundError, match=r"^no saved buffer in"):
        ReplayBuffer(50).loads(str(tmp_path / "missing"))


SAMPLERS: dict[str, Callable[[], object]] = {
    "random": lambda: None,
    "without_replacement": SamplerWithoutReplacement,
    "prioritized": lambda: PrioritizedSampler(alpha=1.0, beta=1.0),
    "slice4": lambda: SliceSampler(slice_len=4),
    "slice2": lambda: SliceSampler(slice_len=2),
}
_SAME = "; create the buffer with the same {} as the saved one$"
SAMPLER_MISMATCHES = [  # (saved, loading into, saved by an older aiocollect, error)
    ("prioritized", "random", False,
     r"^the saved buffer was sampled by PrioritizedSampler, this one uses RandomSampler" + _SAME.format("sampler")),
    ("random", "prioritized", False,
     r"^the saved buffer was sampled by RandomSampler, this one uses PrioritizedSampler" + _SAME.format("sampler")),
    ("random", "without_replacement", False,
     r"^the saved buffer was sampled by RandomSampler, this one uses SamplerWithoutReplacement"
     + _SAME.format("sampler")),
    ("slice4", "random", False,
     r"^the saved buffer was sampled by SliceSampler, this one uses RandomSampler" + _SAME.format("sampler")),
    ("slice4", "slice2", False,
     r"^the saved SliceSampler had slice_len=4, this one has slice_len=2" + _SAME.format("sampler arguments")),
    ("prioritized", "random", True,
     r"^the saved sampler state has entries \['max_priority', 'priorities'\] that a RandomSampler does not use"
     + _SAME.format("sampler")),
    ("random", "prioritized", True,
     r"^the saved sampler state lacks entries \['max_priority', 'priorities'\] that a PrioritizedSampler needs"
     + _SAME.format("sampler")),
    ("random", "without_replacement", True,
     r"^the saved sampler state lacks entries \['perm', 'pos', 'stale'\] that a SamplerWithoutReplacement needs"
     + _SAME.format("sampler")),
]  # fmt: skip


def older_format(state: dict) -> dict:
    """A state as aiocollect saved it before the sampler class and arguments were recorded."""
    state = dict(state, sampler={k: v for k, v in state["sampler"].items() if k != "params"})
    state.pop("sampler_class", None)
    return state


async def receiver(sampler: str, holds_frames: bool, **kw: object) -> ReplayBuffer:
    rb = ReplayBuffer(20, batch_size=4, sampler=SAMPLERS[sampler](), seed=2, **kw)  # type: ignore[arg-type]
    if holds_frames:
        await rb.extend(frames(100, 6, traj=1))
        await rb.sample()
    return rb


def assert_unchanged(rb: ReplayBuffer, twin: ReplayBuffer, holds_frames: bool) -> None:
    """``rb`` (after a refused load) behaves exactly as ``twin`` (built the same way, never loaded into)."""
    assert (len(rb), rb.write_count, rb.storage.built) == (6, 6, True) if holds_frames else (0, 0, False)
    assert (len(rb), rb.write_count, rb.storage.built, rb.stats()) == (
        len(twin),
        twin.write_count,
        twin.storage.built,
        twin.stats(),
    )
    if not holds_frames:
        with pytest.raises(BufferEmptyError):
            rb.sample_nowait()
        return
    for _ in range(4):  # same sampler state and RNG state: the same samples
        a, b = rb.sample_nowait(), twin.sample_nowait()
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["observation"], b["observation"])


@pytest.mark.anyio
@pytest.mark.parametrize("holds_frames", [False, True], ids=["fresh", "holding-frames"])
@pytest.mark.parametrize(("saved", "into", "older", "message"), SAMPLER_MISMATCHES)
async def test_load_state_dict_refuses_another_sampler_and_changes_nothing(
    saved: str, into: str, older: bool, message: str, holds_frames: bool
) -> None:
    src = ReplayBuffer(20, batch_size=4, sampler=SAMPLERS[saved](), seed=1)  # type: ignore[arg-type]
    await src.extend(frames(0, 10))
    state = older_format(src.state_dict()) if older else src.state_dict()
    rb, twin = await receiver(into, holds_frames), await receiver(into, holds_frames)
    with pytest.raises(ValueError, match=message):
        rb.load_state_dict(state)
    assert_unchanged(rb, twin, holds_frames)


@pytest.mark.anyio
async def test_loads_refuses_another_sampler_before_building_or_writing(tmp_path: Path) -> None:
    src = ReplayBuffer(20, batch_size=4, sampler=PrioritizedSampler(alpha=1.0, beta=1.0), seed=1)
    await src.extend(frames(0, 10))
    src.dumps(str(tmp_path / "saved"))
    rb = await receiver("random", False, storage=MemmapStorage(tmp_path / "mine"))
    twin = await receiver("random", False)
    with pytest.raises(ValueError, match=r"^the saved buffer was sampled by PrioritizedSampler, this one uses Random"):
        rb.loads(str(tmp_path / "saved"))
    assert_unchanged(rb, twin, False)
    assert not (tmp_path / "mine").exists()  # the storage was not built
    os.remove(tmp_path / "saved" / "frames" / "000-observation.bin")
    rb = ReplayBuffer(20, batch_size=4, sampler=PrioritizedSampler(alpha=1.0, beta=1.0))
    with pytest.raises(ValueError, match=r"^the saved buffer's frame files \['000-observation\.bin'\] are missing "):
        rb.loads(str(tmp_path / "saved"))
    assert not rb.storage.built and not (tmp_path / "saved" / "frames" / "000-observation.bin").exists()


@pytest.mark.anyio
async def test_load_state_dict_names_every_difference_at_once() -> None:
    src = ReplayBuffer(20, batch_size=4, sampler=PrioritizedSampler(alpha=1.0, beta=1.0), seed=1)
    await src.extend(frames(0, 10))
    state = src.state_dict()
    rb = ReplayBuffer(30, storage=MemoryStorage(ndim=2))
    with pytest.raises(ValueError, match=(
        r"^the saved buffer has capacity 20, this one 30; the saved buffer's storage has ndim 1, this one 2; "
        r"the saved buffer was sampled by PrioritizedSampler, this one uses RandomSampler; "
        r"create the buffer with the same capacity and storage ndim and sampler as the saved one$"
    )):  # fmt: skip
        rb.load_state_dict(state)
    assert not rb.storage.built and rb.write_count == 0
    other = await receiver("prioritized", True)  # stores observation, reward and traj_ids
    state["layout"] = [e for e in state["layout"] if e[0] != "observation"]
    state["frames"].pop("observation")
    twin = await receiver("prioritized", True)
    with pytest.raises(ValueError, match=(
        r"^the saved buffer's entries \['observation'\] differ \(keys, frame shapes or dtypes\) from this one's; "
        r"load into a buffer that has not stored anything yet$"
    )):  # fmt: skip
        other.load_state_dict(state)
    assert_unchanged(other, twin, True)
    empty = ReplayBuffer(20, sampler=PrioritizedSampler(alpha=1.0, beta=1.0)).state_dict()  # saved before any write
    with pytest.raises(ValueError, match=r"^the saved buffer was saved before its first write, this one already"):
        other.load_state_dict(empty)
    assert_unchanged(other, twin, True)


@pytest.mark.anyio
async def test_damaged_states_are_refused_and_change_nothing() -> None:
    src = ReplayBuffer(20, batch_size=4, seed=1)
    await src.extend(frames(0, 10))
    good = src.state_dict()
    cases = [
        ({**good, "format": 9},
         r"^unsupported buffer state format 9 \(this aiocollect reads format 1\); load it with the aiocollect "),
        ({k: v for k, v in good.items() if k != "cursor"},
         r"^the saved buffer state lacks entries \['cursor'\]; pass a dict returned by ReplayBuffer\.state_dict\(\)$"),
        ({**good, "valid": good["valid"][:5]},
         r"^the saved buffer state is damaged: 'valid' is not a bool tensor \[20\]; pass a dict returned by "),
        ({**good, "generator": torch.zeros(3, dtype=torch.uint8)},
         r"^the saved buffer state is damaged: the generator state cannot be restored"),
        ({**good, "frames": {**good["frames"], "observation": torch.zeros(20, 2)}},
         r"^the saved buffer state is damaged: its frames \['observation'\] do not match its layout; pass a dict "
         r"returned by ReplayBuffer\.state_dict\(\)$"),
    ]  # fmt: skip
    for holds_frames in (False, True):
        rb, twin = await receiver("random", holds_frames), await receiver("random", holds_frames)
        with pytest.raises(TypeError, match=r"^a saved buffer state must be a dict, got list; pass a dict "):
            rb.load_state_dict([])  # type: ignore[arg-type]
        for state, message in cases:
            with pytest.raises(ValueError, match=message):
                rb.load_state_dict(state)
        assert_unchanged(rb, twin, holds_frames)


@pytest.mark.anyio
async def test_older_states_without_the_sampler_class_still_load() -> None:
    src = ReplayBuffer(20, batch_size=4, sampler=PrioritizedSampler(alpha=1.0, beta=0.5), seed=1)
    await src.extend(frames(0, 10))
    src.update_priority(torch.arange(10), torch.arange(10.0))
    state = src.state_dict()
    assert state["sampler_class"] == "aiocollect.PrioritizedSampler"
    copy = ReplayBuffer(20, batch_size=4, sampler=PrioritizedSampler(alpha=1.0, beta=0.5))
    copy.load_state_dict(older_format(state))
    a, b = await src.sample(), await copy.sample()
    assert torch.equal(a["index"], b["index"]) and torch.equal(a["_weight"], b["_weight"])
    annealed = ReplayBuffer(20, batch_size=4, sampler=PrioritizedSampler(alpha=1.0, beta=1.0))
    annealed.load_state_dict(state)  # beta is not part of the match: it may be annealed
    assert annealed.sampler.beta == 1.0 and len(annealed) == 10


@pytest.mark.anyio
async def test_prioritized_sampling_follows_updated_priorities() -> None:
    rb = ReplayBuffer(100, batch_size=256, sampler=PrioritizedSampler(alpha=1.0, beta=1.0), seed=0)
    await rb.extend(frames(0, 4))
    rb.update_priority(torch.arange(4), torch.tensor([1.0, 1.0, 1.0, 97.0]))
    counts = torch.zeros(4)
    for _ in range(40):
        batch = await rb.sample()
        counts += torch.bincount(batch["index"], minlength=4)
        assert "_weight" in batch.keys() and float(batch["_weight"].max()) <= 1.0
    assert counts[3] / counts.sum() == pytest.approx(0.97, abs=0.01)
    with pytest.raises(TypeError, match=r"^update_priority\(\) needs a PrioritizedSampler"):
        ReplayBuffer(10).update_priority(torch.arange(1), 1.0)


@pytest.mark.anyio
async def test_slice_sampler_waits_until_a_whole_slice_is_stored() -> None:
    rb = ReplayBuffer(100, batch_size=8, sampler=SliceSampler(slice_len=4), seed=0)
    got: list[TensorDict] = []

    async def learner() -> None:
        got.append(await rb.sample())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(learner)
            await rb.extend(frames(0, 3, traj=1))  # too short for a slice of 4
            await anyio.wait_all_tasks_blocked()
            assert not got
            await rb.extend(frames(3, 6, traj=2))
    obs = got[0]["observation"][:, 0].reshape(2, 4)
    assert torch.equal(obs - obs[:, :1], torch.arange(4.0).expand(2, 4))  # consecutive frames
    assert (got[0]["collector", "traj_ids"] == 2).all()


@pytest.mark.anyio
async def test_slice_sampler_not_strict_returns_short_trajectories_split_by_slice_ids() -> None:
    rb = ReplayBuffer(100, batch_size=12, sampler=SliceSampler(slice_len=4, strict_length=False), seed=0)
    await rb.extend(frames(0, 2, traj=1))  # shorter than a slice: sampled whole
    await rb.extend(frames(2, 5, traj=2))  # two possible slices, [2..5] and [3..6]
    strict = ReplayBuffer(100, batch_size=12, sampler=SliceSampler(slice_len=4), seed=0)
    await strict.extend(frames(0, 2, traj=1))
    await strict.extend(frames(2, 5, traj=2))
    seen: set[tuple[float, ...]] = set()
    for _ in range(30):
        with anyio.fail_after(10):
            batch = await rb.sample()
        # split_trajectories on the slice ids: one row per slice, even two adjacent slices of trajectory 2
        rows = split_trajectories(batch, trajectory_key=("collector", "slice_ids"))
        lengths = rows["collector", "mask"].sum(-1)
        assert rows.shape[0] == 3 and batch.numel() == int(lengths.sum()) <= 12
        for row, n in zip(rows, lengths.tolist(), strict=True):
            obs = row["observation"][:n, 0]
            assert torch.equal(obs - obs[0], torch.arange(float(n)))  # consecutive frames
            assert row["collector", "traj_ids"][:n].unique().numel() == 1
            seen.add(tuple(obs.tolist()))
        assert (await strict.sample())["collector", "slice_ids"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert seen == {(0.0, 1.0), (2.0, 3.0, 4.0, 5.0), (3.0, 4.0, 5.0, 6.0)}


@pytest.mark.anyio
async def test_slice_sampler_not_strict_with_ndim2_rows_shorter_than_a_slice() -> None:
    # [2 envs, 3 steps] rollouts: every row is a segment of 3 frames, shorter than slice_len 4.
    loose = ReplayBuffer(12, batch_size=8, storage=MemoryStorage(ndim=2), seed=0,
                         sampler=SliceSampler(slice_len=4, strict_length=False))  # fmt: skip
    strict = ReplayBuffer(12, batch_size=8, storage=MemoryStorage(ndim=2), sampler=SliceSampler(slice_len=4))
    for start in (0, 6, 12):  # the third rollout overwrites the first (the ring wraps)
        rollout = frames(start, 6).reshape(2, 3)
        rollout["collector", "traj_ids"] = torch.tensor([[start, start, start], [start + 1] * 3])
        await loose.extend(rollout)
        await strict.extend(rollout)
    with pytest.raises(BufferEmptyError, match=r"^no trajectory segment of 4 consecutive frames"):
        strict.sample_nowait()
    rows: set[tuple[float, ...]] = set()
    for _ in range(20):
        with anyio.fail_after(10):
            batch = await loose.sample()
        assert batch["collector", "slice_ids"].tolist() == [0, 0, 0, 1, 1, 1]  # two whole rows
        rows |= {tuple(part.tolist()) for part in batch["observation"][:, 0].split(3)}
    assert rows == {(6.0, 7.0, 8.0), (9.0, 10.0, 11.0), (12.0, 13.0, 14.0), (15.0, 16.0, 17.0)}
    assert loose.stats().sample_count == 20 * 6  # the frames returned, not batch_size


@pytest.mark.anyio
async def test_max_policy_lag_drops_old_frames() -> None:
    rb = ReplayBuffer(100, batch_size=4, max_policy_lag=1, seed=0)
    for version in range(3):
        td = frames(version * 4, 4)
        td["collector", "policy_version"] = torch.full((4,), version)
        rb.policy_version = version
        await rb.extend(td)
    assert stored(rb) == list(range(4, 12))  # version 0 is two behind version 2: dropped
    rb.policy_version = 1  # older than what the buffer knows: ignored
    assert rb.policy_version == 2 and len(rb) == 8
    rb.policy_version = 3  # now version 1 is too old as well
    assert stored(rb) == list(range(8, 12)) and rb.stats().stale_dropped == 8
    batch = await rb.sample()
    assert (batch["collector", "policy_version"] == 2).all()
    assert rb.stats().sampled_policy_lag_max == 1


@pytest.mark.anyio
async def test_failure_is_raised_by_waiting_and_later_samples() -> None:
    rb = ReplayBuffer(100, batch_size=4)
    error = RuntimeError("collector died")

    async def learner() -> None:
        with pytest.raises(RuntimeError, match=r"^collector died$"):
            await rb.sample()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(learner)
            await anyio.wait_all_tasks_blocked()
            rb.fail(error)
    with pytest.raises(RuntimeError, match=r"^collector died$"):
        await rb.extend(frames(0, 4))


@pytest.mark.anyio
async def test_close_wakes_waiters_with_buffer_closed_error() -> None:
    rb = ReplayBuffer(100, batch_size=4)

    async def learner() -> None:
        with pytest.raises(BufferClosedError, match=r"^this ReplayBuffer was closed"):
            await rb.wait_for(10)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(learner)
            await anyio.wait_all_tasks_blocked()
            await rb.aclose()
    await rb.aclose()  # idempotent


def test_blocking_twin_waits_in_the_thread_and_refuses_running_loops() -> None:
    with blocking.ReplayBuffer(100, batch_size=4, seed=0) as rb:
        rb.extend(frames(0, 8))
        assert rb.sample().shape == (4,) and len(rb) == 8 and rb.write_count == 8
        assert not rb._portal.running  # nothing had to wait: no event-loop thread was needed
        rb.wait_for(8)
        assert rb._portal.running

        async def misuse() -> None:
            rb.sample(batch_size=4)  # fine: nothing to wait for
            rb.wait_for(50)  # would block the running loop: refused

        with pytest.raises(
            RuntimeError,
            match=r"^aiocollect\.blocking\.ReplayBuffer cannot be used inside a running "
            r"event loop; use aiocollect\.ReplayBuffer with 'async with' instead$",
        ):
            anyio.run(misuse)
    assert repr(rb).startswith("<blocking.ReplayBuffer [closed")


@pytest.mark.anyio
async def test_waiters_on_another_event_loop_are_woken() -> None:
    rb = ReplayBuffer(100, batch_size=4)
    result: list[int] = []

    def other_loop() -> None:
        async def learner() -> None:
            result.append((await rb.sample()).numel())

        anyio.run(learner)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, other_loop)
            while not rb._notifier._waiters:  # the other loop's task is now waiting
                await anyio.lowlevel.checkpoint()
            await rb.extend(frames(0, 4))
    assert result == [4]


def test_bad_arguments_are_refused_with_the_rule() -> None:
    cases = [
        ({"capacity": 0}, ValueError, r"^capacity must be a positive int, got 0$"),
        ({"capacity": 10, "batch_size": 0}, ValueError, r"^batch_size must be a positive int or None, got 0$"),
        ({"capacity": 10, "min_size": 11}, ValueError, r"^min_size \(11\) must not exceed capacity \(10\)"),
        ({"capacity": 10, "samples_per_insert": -1}, ValueError, r"^samples_per_insert must be a positive number"),
        ({"capacity": 10, "tolerance": 0}, ValueError, r"^tolerance must be a positive number of frames"),
        (
            {"capacity": 10, "storage": 3},
            TypeError,
            r"^storage must be None, 'memory', 'shared', 'memmap' or a Storage",
        ),
        ({"capacity": 10, "transform": 1}, TypeError, r"^transform must be a callable"),
        ({"capacity": 10, "max_policy_lag": -1}, ValueError, r"^max_policy_lag must be an int >= 0 or None, got -1$"),
    ]
    for kwargs, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            ReplayBuffer(**kwargs)

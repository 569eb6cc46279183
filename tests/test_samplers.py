"""Tests of the replay-buffer index samplers (`aiocollect._buffer._samplers`, `_prioritized`, `_slices`)."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
import torch

from aiocollect._buffer._prioritized import PrioritizedSampler
from aiocollect._buffer._samplers import (
    BufferEmptyError,
    RandomSampler,
    SampleContext,
    Sampler,
    SamplerWithoutReplacement,
    make_sampler,
)
from aiocollect._buffer._slices import SliceSampler

SLICE_IDS = ("collector", "slice_ids")
EMPTY = r"^sample\(\) called on an empty buffer; await buffer\.wait_for\(n\) first$"


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def context(
    valid: torch.Tensor,
    size: int | None = None,
    traj: torch.Tensor | None = None,
    workers: torch.Tensor | None = None,
    row_length: int | None = None,
) -> SampleContext:
    valid = torch.as_tensor(valid, dtype=torch.bool)
    size = int(valid.nonzero().max()) + 1 if size is None and valid.any() else size or 0
    assert not valid[size:].any(), "test bug: valid frames beyond size"
    return SampleContext(valid, int(valid.sum()), size, traj, workers, row_length)


def full(capacity: int, **kw: object) -> SampleContext:
    return context(torch.ones(capacity, dtype=torch.bool), capacity, **kw)  # type: ignore[arg-type]


def draw(sampler: Sampler, ctx: SampleContext, batch: int, calls: int, seed: int = 0):
    g = gen(seed)
    out = [sampler.sample(ctx, batch, g) for _ in range(calls)]
    return torch.cat([i for i, _ in out]), out


# --------------------------------------------------------------------------- RandomSampler


def _holey(capacity: int = 100, size: int = 80) -> SampleContext:
    valid = torch.zeros(capacity, dtype=torch.bool)
    valid[:size] = True
    valid[30:40] = False  # a reserved block
    valid[[i for i in (3, 44, 57, 79) if i < size]] = False
    return context(valid, size)


def test_random_returns_only_valid_frames_and_covers_them_all() -> None:
    ctx = _holey()
    sampler = RandomSampler()
    sampler.reset(100)
    index, out = draw(sampler, ctx, 64, 200)
    assert index.dtype == torch.int64 and all(i.shape == (64,) for i, _ in out)
    assert all(info == {} for _, info in out)
    assert ctx.valid[index].all() and (index < ctx.size).all()
    assert set(index.tolist()) == set(ctx.valid.nonzero().squeeze(1).tolist())


def test_random_is_uniform() -> None:
    ctx = _holey()
    index, _ = draw(RandomSampler(), ctx, 500, 200)
    counts = torch.bincount(index, minlength=100)[ctx.valid].double()
    expected = index.numel() / ctx.num_valid
    assert ((counts - expected).abs() / expected).max() < 0.1  # ~4.5 sigma at 1500 per frame


def test_random_is_reproducible_from_the_generator() -> None:
    ctx = _holey()
    a, _ = draw(RandomSampler(), ctx, 128, 5, seed=1)
    b, _ = draw(RandomSampler(), ctx, 128, 5, seed=1)
    c, _ = draw(RandomSampler(), ctx, 128, 5, seed=2)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_random_falls_back_when_almost_everything_is_reserved() -> None:
    valid = torch.zeros(10_000, dtype=torch.bool)
    valid[1234] = True
    ctx = context(valid, 10_000)
    index, _ = draw(RandomSampler(), ctx, 256, 3)
    assert (index == 1234).all()


def test_random_on_empty_buffer_raises() -> None:
    ctx = context(torch.zeros(8, dtype=torch.bool), 0)
    with pytest.raises(BufferEmptyError, match=EMPTY):
        RandomSampler().sample(ctx, 4, gen())
    assert issubclass(BufferEmptyError, LookupError)


# --------------------------------------------------------------- SamplerWithoutReplacement


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("batch", [1, 7, 13, 64])
def test_without_replacement_returns_each_valid_frame_once_per_epoch(shuffle: bool, batch: int) -> None:
    ctx = _holey(capacity=50, size=47)
    valid = ctx.valid.nonzero().squeeze(1)
    n = valid.numel()
    sampler = SamplerWithoutReplacement(shuffle=shuffle)
    sampler.reset(50)
    epochs = 4
    calls = -(-epochs * n // batch)
    index, out = draw(sampler, ctx, batch, calls)
    assert all(i.shape == (batch,) for i, _ in out)
    for e in range(epochs):
        epoch = index[e * n : (e + 1) * n]
        assert torch.equal(epoch.sort().values, valid), f"epoch {e}"
        if not shuffle:
            assert torch.equal(epoch, valid)
    if shuffle:
        assert not torch.equal(index[:n], index[n : 2 * n])  # a new permutation each epoch


def test_without_replacement_skips_invalidated_frames_until_next_epoch() -> None:
    valid = torch.ones(20, dtype=torch.bool)
    sampler = SamplerWithoutReplacement(shuffle=False)
    sampler.reset(20)
    g = gen()
    assert sampler.sample(context(valid, 20), 5, g)[0].tolist() == [0, 1, 2, 3, 4]
    # frames 6, 7 get reserved, rewritten and committed again mid-epoch; 9 only reserved
    sampler.invalidate(torch.tensor([6, 7, 9]))
    valid[[6, 7, 9]] = False
    sampler.extend(torch.tensor([6, 7]))
    valid[[6, 7]] = True
    rest = [sampler.sample(context(valid, 20), 4, g)[0] for _ in range(3)]
    assert torch.cat(rest).tolist() == [5, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    # the next epoch has the rewritten frames again, but not the still-reserved one
    assert sampler.sample(context(valid, 20), 19, g)[0].tolist() == [i for i in range(20) if i != 9]


def test_without_replacement_frames_added_mid_epoch_wait_for_the_next() -> None:
    sampler = SamplerWithoutReplacement()
    sampler.reset(30)
    g = gen()
    valid = torch.zeros(30, dtype=torch.bool)
    valid[:10] = True
    first = sampler.sample(context(valid, 10), 4, g)[0]
    valid[10:20] = True
    sampler.extend(torch.arange(10, 20))
    rest = torch.cat([sampler.sample(context(valid, 20), 3, g)[0] for _ in range(2)])
    assert sorted(torch.cat([first, rest]).tolist()) == list(range(10))
    nxt = torch.cat([sampler.sample(context(valid, 20), 5, g)[0] for _ in range(4)])
    assert sorted(nxt.tolist()) == list(range(20))


def test_without_replacement_drop_last() -> None:
    sampler = SamplerWithoutReplacement(drop_last=True, shuffle=False)
    sampler.reset(10)
    index, _ = draw(sampler, full(10), 4, 4)
    assert index.view(4, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    sampler = SamplerWithoutReplacement(drop_last=True)
    sampler.reset(10)
    for i, _ in draw(sampler, full(10), 3, 12)[1]:
        assert i.unique().numel() == 3
    sampler.reset(10)
    msg = r"^drop_last=True needs at least batch_size=11 valid frames, got 10; collect more"
    with pytest.raises(BufferEmptyError, match=msg):
        sampler.sample(full(10), 11, gen())


def test_without_replacement_tops_up_from_new_epochs_when_batch_exceeds_data() -> None:
    sampler = SamplerWithoutReplacement()
    sampler.reset(3)
    index = sampler.sample(full(3), 7, gen())[0]
    assert index.shape == (7,) and sorted(index[:6].tolist()) == [0, 0, 1, 1, 2, 2]


def test_without_replacement_state_dict_round_trip() -> None:
    ctx = _holey(capacity=64, size=60)
    sampler = SamplerWithoutReplacement()
    sampler.reset(64)
    g = gen(3)
    for _ in range(3):
        sampler.sample(ctx, 9, g)
    sampler.invalidate(torch.tensor([0, 1, 2]))
    state, g_state = sampler.state_dict(), g.get_state()
    expected = torch.cat([sampler.sample(ctx, 9, g)[0] for _ in range(10)])
    restored = SamplerWithoutReplacement()
    restored.load_state_dict(state)
    g.set_state(g_state)
    again = torch.cat([restored.sample(ctx, 9, g)[0] for _ in range(10)])
    assert torch.equal(expected, again)


def test_without_replacement_on_empty_buffer_raises() -> None:
    sampler = SamplerWithoutReplacement()
    sampler.reset(4)
    with pytest.raises(BufferEmptyError, match=EMPTY):
        sampler.sample(context(torch.zeros(4, dtype=torch.bool), 0), 2, gen())


# ----------------------------------------------------------------------- PrioritizedSampler


def _prioritized(capacity: int, priorities: list[float], **kw: float) -> PrioritizedSampler:
    sampler = PrioritizedSampler(**{"alpha": 1.0, "beta": 0.5, "eps": 0.0, **kw})
    sampler.reset(capacity)
    sampler.extend(torch.arange(len(priorities)))
    sampler.update_priority(torch.arange(len(priorities)), torch.tensor(priorities))
    return sampler


def _frequencies(sampler: PrioritizedSampler, ctx: SampleContext, n: int = 200_000) -> np.ndarray:
    index, _ = draw(sampler, ctx, 500, n // 500)
    return torch.bincount(index, minlength=ctx.valid.numel()).double().numpy() / index.numel()


@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_prioritized_frequencies_match_priorities(alpha: float) -> None:
    raw = np.arange(1.0, 11.0)
    sampler = _prioritized(10, raw.tolist(), alpha=alpha, eps=1e-3)  # capacity not a power of 2
    expected = (raw + 1e-3) ** alpha
    expected /= expected.sum()
    freq = _frequencies(sampler, full(10))
    assert np.abs(freq / expected - 1).max() < 0.03


def test_prioritized_stratified_draws_cover_equal_priorities_exactly() -> None:
    sampler = PrioritizedSampler(alpha=0.7, beta=1.0)
    sampler.reset(37)
    sampler.extend(torch.arange(37))
    index, info = sampler.sample(full(37), 37, gen())
    assert index.tolist() == list(range(37))  # one draw in each equal slice of the mass
    assert info["_weight"].dtype == torch.float32 and (info["_weight"] == 1).all()


def test_prioritized_update_priority_changes_frequencies() -> None:
    sampler = _prioritized(8, [1.0] * 8)
    before = _frequencies(sampler, full(8), 40_000)
    assert np.abs(before - 1 / 8).max() < 0.01
    sampler.update_priority(torch.tensor([2, 5]), torch.tensor([8.0, 0.0]))
    after = _frequencies(sampler, full(8), 40_000)
    assert after[5] == 0
    assert abs(after[2] - 8 / 14) < 0.01 and abs(after[0] - 1 / 14) < 0.01


def test_prioritized_never_draws_invalidated_or_unwritten_frames() -> None:
    sampler = _prioritized(64, [1.0] * 40)
    sampler.invalidate(torch.arange(10, 20))
    valid = torch.zeros(64, dtype=torch.bool)
    valid[:40] = True
    valid[10:20] = False
    index, _ = draw(sampler, context(valid, 40), 256, 50)
    assert set(index.tolist()) == set(valid.nonzero().squeeze(1).tolist())
    # a late update must not revive an invalidated frame; a new extend() does
    sampler.update_priority(torch.tensor([12]), 100.0)
    assert 12 not in draw(sampler, context(valid, 40), 256, 10)[0].tolist()
    sampler.extend(torch.tensor([12]))
    valid[12] = True
    assert 12 in draw(sampler, context(valid, 40), 256, 10)[0].tolist()


def test_prioritized_new_frames_get_the_running_max_priority() -> None:
    sampler = PrioritizedSampler(alpha=0.5, beta=0.4, eps=0.25, max_priority=2.0)
    sampler.reset(6)
    sampler.extend(torch.tensor([0, 1]))
    assert sampler.state_dict()["priorities"][:2].tolist() == [2.0**0.5] * 2
    sampler.update_priority(torch.tensor([0, 1]), torch.tensor([8.75, 1.0]))
    assert sampler.max_priority == 9.0
    sampler.update_priority(torch.tensor([0]), 0.0)  # the max never decreases
    sampler.extend(torch.tensor([4]))
    assert sampler.state_dict()["priorities"].tolist() == [0.5, 1.25**0.5, 0, 0, 3.0, 0]


def test_prioritized_weights_follow_torchrl_formula() -> None:
    priorities = [4.0, 1.0, 0.5, 2.0, 8.0]
    sampler = _prioritized(5, priorities, alpha=0.8, beta=0.6)
    stored = torch.tensor(priorities, dtype=torch.float64) ** 0.8
    index, info = sampler.sample(full(5), 400, gen())
    expected = (stored[index] / stored.min()) ** -0.6  # (p_i / p_min) ** -beta
    assert torch.allclose(info["_weight"].double(), expected, rtol=1e-6)
    assert info["_weight"].max() == 1.0 and (index == 2).any()
    by_hand = torch.tensor((8 / 0.5) ** (-0.8 * 0.6), dtype=torch.float64)
    assert torch.allclose(info["_weight"][index == 4].double(), by_hand)


def test_prioritized_update_priority_validation_and_details() -> None:
    sampler = _prioritized(16, [1.0] * 16)
    with pytest.raises(ValueError, match=r"^index and priority must have the same length, got 5 and 4$"):
        sampler.update_priority(torch.arange(5), torch.ones(4))
    with pytest.raises(ValueError, match=r"^priority must be finite and >= 0, got -1\.0$"):
        sampler.update_priority(torch.arange(3), torch.tensor([1.0, -1.0, 2.0]))
    with pytest.raises(ValueError, match=r"^priority must be finite and >= 0, got nan$"):
        sampler.update_priority(torch.arange(2), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match=r"^index must be in \[0, 16\), got 16$"):
        sampler.update_priority(torch.tensor([3, 16]), 1.0)
    with pytest.raises(ValueError, match=r"^index must be in \[0, 16\), got -1$"):
        sampler.update_priority(torch.tensor([-1]), 1.0)
    sampler.update_priority(torch.tensor([1, 2, 1, 3, 1]), torch.tensor([5.0, 6.0, 7.0, 2.0, 9.0]))
    assert sampler.state_dict()["priorities"][:5].tolist() == [1.0, 9.0, 6.0, 2.0, 1.0]
    sampler.update_priority(torch.tensor([[4, 5], [6, 7]]), 3.0)  # any shape; one for all
    assert sampler.state_dict()["priorities"][4:9].tolist() == [3.0] * 4 + [1.0]
    sampler.update_priority(torch.tensor([], dtype=torch.int64), torch.tensor([]))


def test_prioritized_trees_stay_consistent_under_vectorized_updates() -> None:
    capacity = 20_000
    sampler = PrioritizedSampler(alpha=0.6, beta=0.4)
    sampler.reset(capacity)
    sampler.extend(torch.arange(10_000))  # large: updates every level at once
    rng = np.random.default_rng(0)
    for _ in range(20):  # small batches, with repeated indices: the sparse path
        idx = torch.from_numpy(rng.integers(0, 12_000, 800))
        sampler.extend(idx[:100])
        sampler.invalidate(idx[100:200])
        sampler.update_priority(idx[200:], torch.from_numpy(rng.random(600) * 10))
    tree_sum, tree_min, leaf0 = sampler._sum, sampler._min, sampler._leaf0
    parents = np.arange(1, leaf0)
    left, right = 2 * parents, 2 * parents + 1
    assert np.array_equal(tree_sum[parents], tree_sum[left] + tree_sum[right])
    assert np.array_equal(tree_min[parents], np.minimum(tree_min[left], tree_min[right]))
    leaves = sampler.state_dict()["priorities"].numpy()
    assert np.isclose(tree_sum[1], leaves.sum()) and tree_min[1] == leaves[leaves > 0].min()


def test_prioritized_state_dict_round_trip_gives_identical_samples() -> None:
    sampler = _prioritized(300, np.linspace(0.1, 5, 250).tolist(), alpha=0.7, beta=0.3)
    sampler.invalidate(torch.arange(20, 40))
    state = sampler.state_dict()
    restored = PrioritizedSampler(alpha=0.7, beta=0.3, eps=0.0)
    restored.load_state_dict(state)
    a, out_a = draw(sampler, full(300), 128, 10, seed=5)
    b, out_b = draw(restored, full(300), 128, 10, seed=5)
    assert torch.equal(a, b)
    assert all(torch.equal(x["_weight"], y["_weight"]) for (_, x), (_, y) in zip(out_a, out_b, strict=True))
    sampler.extend(torch.tensor([299]))
    restored.extend(torch.tensor([299]))
    assert torch.equal(sampler.state_dict()["priorities"], restored.state_dict()["priorities"])


def test_prioritized_rounding_overshoot_never_lands_on_a_zero_priority_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0)
    sampler.reset(4)
    sampler.extend(torch.tensor([0]))  # frames 1..3 have priority 0
    leaf0 = sampler._leaf0
    assert sampler._descend(np.array([1.0]), guard=False)[0] - leaf0 == 3  # what rounding risks
    assert sampler._descend(np.array([1.0]), guard=True)[0] - leaf0 == 0
    # u == 1.0 puts the last stratum's point exactly at the total mass
    monkeypatch.setattr(torch, "rand", lambda n, **kw: torch.ones(n, dtype=torch.float64))
    assert sampler.sample(full(4), 2, gen())[0].tolist() == [0, 0]


def test_prioritized_raises_when_nothing_is_sampleable() -> None:
    sampler = PrioritizedSampler(alpha=0.6, beta=0.4)
    sampler.reset(8)
    with pytest.raises(BufferEmptyError, match=EMPTY):
        sampler.sample(context(torch.zeros(8, dtype=torch.bool), 0), 4, gen())
    with pytest.raises(BufferEmptyError):  # frames valid, but never extend()ed
        sampler.sample(full(8), 4, gen())


# ---------------------------------------------------------------------------- SliceSampler


def _runs(lengths: list[int], ids: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((n,), i, dtype=torch.int64) for n, i in zip(lengths, ids, strict=True)])


def _check_slices(index: torch.Tensor, length: int, ctx: SampleContext) -> torch.Tensor:
    slices = index.view(-1, length)
    assert (slices[:, 1:] - slices[:, :-1] == 1).all(), "not consecutive"
    assert (slices >= 0).all() and (slices < ctx.size).all()
    assert ctx.valid[slices].all(), "invalid frame in a slice"
    for ids in (ctx.traj_ids, ctx.worker_ids):
        if ids is not None:
            assert (ids[slices] == ids[slices[:, :1]]).all(), "crosses a trajectory or worker"
    if ctx.row_length is not None:
        rows = slices // ctx.row_length
        assert (rows == rows[:, :1]).all(), "crosses a row"
    return slices[:, 0]


def _possible_starts(ctx: SampleContext, length: int) -> set[int]:
    """Brute force, frame by frame."""
    starts = set()
    for s in range(ctx.size - length + 1):
        window = torch.arange(s, s + length)
        try:
            _check_slices(window, length, ctx)
        except AssertionError:
            continue
        starts.add(s)
    return starts


def _two_worker_context(capacity: int = 240) -> SampleContext:
    # traj ids count per worker, so neighbouring runs of different workers share an id
    lengths = [3, 12, 5, 20, 2, 30, 9, 9, 1, 16, 40, 8, 25, 60]
    traj = _runs(lengths, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6])
    workers = _runs(lengths, [0, 1] * 7)
    valid = torch.zeros(capacity, dtype=torch.bool)
    valid[: traj.numel()] = True
    valid[70:78] = False  # reserved in the middle of a trajectory
    size = traj.numel()
    pad = capacity - size
    traj = torch.cat([traj, torch.full((pad,), -1)])
    workers = torch.cat([workers, torch.full((pad,), -1)])
    return context(valid, size, traj, workers)


def test_slices_never_cross_boundaries_and_cover_all_starts() -> None:
    ctx = _two_worker_context()
    sampler = SliceSampler(slice_len=8)
    sampler.reset(240)
    index, out = draw(sampler, ctx, 64, 400)
    ids = torch.arange(8).repeat_interleave(8)  # slice k is frames 8k .. 8k+7 of the batch
    assert all(i.shape == (64,) and torch.equal(info.pop(SLICE_IDS), ids) and not info for i, info in out)
    starts = _check_slices(index, 8, ctx)
    assert set(starts.tolist()) == _possible_starts(ctx, 8)
    counts = torch.bincount(starts, minlength=240)[sorted(_possible_starts(ctx, 8))].double()
    k, mean = counts.numel(), counts.mean()
    chi2 = float(((counts - mean) ** 2 / mean).sum())
    assert chi2 < k + 6 * (2 * k) ** 0.5  # uniform over the possible starts (chi-square)


def test_slices_respect_the_worker_boundary_even_with_equal_traj_ids() -> None:
    traj = torch.zeros(12, dtype=torch.int64)
    workers = _runs([6, 6], [0, 1])
    ctx = full(12, traj=traj, workers=workers)
    starts = _check_slices(draw(SliceSampler(slice_len=4), ctx, 40, 20)[0], 4, ctx)
    assert set(starts.tolist()) == {0, 1, 2, 6, 7, 8}


def test_slices_stay_in_one_row() -> None:
    ctx = full(120, traj=torch.zeros(120, dtype=torch.int64), row_length=20)
    sampler = SliceSampler(num_slices=4)
    index, _ = draw(sampler, ctx, 24, 500)  # slice_len 6
    starts = _check_slices(index, 6, ctx)
    assert set(starts.tolist()) == _possible_starts(ctx, 6)
    assert set((starts % 20).tolist()) == set(range(15))


def test_slices_do_not_wrap_around_the_end_of_the_index_space() -> None:
    ctx = full(10, traj=torch.zeros(10, dtype=torch.int64))
    starts = _check_slices(draw(SliceSampler(slice_len=4), ctx, 40, 20)[0], 4, ctx)
    assert set(starts.tolist()) == set(range(7))


def test_slices_exact_fallback_finds_rare_starts() -> None:
    traj = torch.arange(20_000)  # every frame its own trajectory ...
    traj[12_345:12_350] = 12_345  # ... but one of 5 frames
    ctx = full(20_000, traj=traj)
    index, _ = draw(SliceSampler(slice_len=5), ctx, 20, 3)
    assert index.view(-1, 5)[:, 0].eq(12_345).all()
    _check_slices(index, 5, ctx)


def test_slices_none_possible_raises() -> None:
    ctx = _two_worker_context()
    msg = (
        r"^no trajectory segment of 61 consecutive frames is stored yet; "
        r"collect more or lower slice_len$"
    )
    with pytest.raises(BufferEmptyError, match=msg):
        SliceSampler(slice_len=61).sample(ctx, 61, gen())
    short = context(torch.ones(3, dtype=torch.bool), 3, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(BufferEmptyError, match=r"^no trajectory segment of 4 "):
        SliceSampler(slice_len=4).sample(short, 8, gen())
    with pytest.raises(BufferEmptyError, match=EMPTY):
        SliceSampler(slice_len=4).sample(context(torch.zeros(3), 0, torch.zeros(3)), 8, gen())


def _segments(ctx: SampleContext) -> list[tuple[int, int]]:
    """Brute force: (first frame, length) of every longest run a slice may lie in."""
    out: list[tuple[int, int]] = []
    for i in range(ctx.size):
        if not ctx.valid[i]:
            continue
        if out and out[-1][0] + out[-1][1] == i and _check_slices_safe(torch.tensor([i - 1, i]), 2, ctx):
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


def _possible_slices(ctx: SampleContext, length: int, strict: bool) -> set[tuple[int, int]]:
    full_ = {(s + j, length) for s, n in _segments(ctx) for j in range(n - length + 1)}
    return full_ if strict else full_ | {(s, n) for s, n in _segments(ctx) if n < length}


def _slices_of(index: torch.Tensor, info: dict, ctx: SampleContext) -> list[tuple[int, int]]:
    """(start, length) of each slice of a batch, checked to be numbered 0, 1, ... and consecutive."""
    ids = info[SLICE_IDS]
    counts = torch.bincount(ids)
    assert (counts > 0).all() and torch.equal(ids, torch.arange(counts.numel()).repeat_interleave(counts))
    first = counts.cumsum(0) - counts
    assert torch.equal(index - index[first][ids], torch.arange(ids.numel()) - first[ids]), "not consecutive"
    return list(zip(index[first].tolist(), counts.tolist(), strict=True))


def _check_slices_safe(index: torch.Tensor, length: int, ctx: SampleContext) -> bool:
    try:
        _check_slices(index, length, ctx)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("strict", [True, False])
def test_slices_not_strict_add_whole_segments_shorter_than_a_slice(strict: bool) -> None:
    ctx = _two_worker_context()  # segments of 1 to 60 frames
    sampler = SliceSampler(slice_len=8, strict_length=strict)
    _, out = draw(sampler, ctx, 64, 600)
    drawn = [sl for i, info in out for sl in _slices_of(i, info, ctx)]
    assert len(drawn) == 8 * 600  # always batch_size // slice_len slices
    possible = _possible_slices(ctx, 8, strict)
    assert set(drawn) == possible  # short segments are whole, cut at their end; none is split
    assert any(n < 8 for _, n in possible) != strict
    tally = Counter(drawn)
    counts = torch.tensor([tally[sl] for sl in sorted(possible)], dtype=torch.float64)
    k, mean = counts.numel(), counts.mean()
    assert float(((counts - mean) ** 2 / mean).sum()) < k + 6 * (2 * k) ** 0.5  # uniform
    sizes = [i.numel() for i, _ in out]
    assert (min(sizes) < 64) != strict and max(sizes) == 64


def test_slices_not_strict_sample_trajectories_shorter_than_slice_len() -> None:
    traj = _runs([3, 2, 3], [0, 1, 2])
    ctx = full(8, traj=traj)
    with pytest.raises(BufferEmptyError, match=r"^no trajectory segment of 4 "):
        SliceSampler(slice_len=4).sample(ctx, 8, gen())
    loose = SliceSampler(num_slices=2, strict_length=False)  # slice_len 4
    batches = [loose.sample(ctx, 8, gen(seed)) for seed in range(40)]
    assert all(len(_slices_of(index, info, ctx)) == 2 for index, info in batches)
    assert {sl for b in batches for sl in _slices_of(*b, ctx)} == {(0, 3), (3, 2), (5, 3)}


def test_slices_not_strict_stop_at_the_end_of_the_ring() -> None:
    # Trajectory 9 wrapped around the ring: frames 7..9 then 0..2. A slice never wraps, so
    # each piece is a segment of its own, returned whole (cut at index 9) only if not strict.
    ctx = full(10, traj=torch.tensor([9, 9, 9, 8, 8, 8, 8, 9, 9, 9]))
    for strict, expected in ((True, {(3, 4)}), (False, {(3, 4), (0, 3), (7, 3)})):
        sampler = SliceSampler(slice_len=4, strict_length=strict)
        assert {sl for seed in range(30) for sl in _slices_of(*sampler.sample(ctx, 8, gen(seed)), ctx)} == expected


def test_slices_not_strict_stay_in_one_row() -> None:
    ctx = full(12, traj=torch.zeros(12, dtype=torch.int64), row_length=3)  # rows of 3 < slice_len 4
    loose = SliceSampler(slice_len=4, strict_length=False)
    got = {sl for seed in range(30) for sl in _slices_of(*loose.sample(ctx, 8, gen(seed)), ctx)}
    assert got == {(0, 3), (3, 3), (6, 3), (9, 3)}


def test_slices_not_strict_exact_fallback_matches_rejection() -> None:
    traj = torch.arange(20_000)  # every frame its own trajectory: 1-frame segments ...
    traj[12_345:12_350] = 12_345  # ... and one of 5 frames
    ctx = full(20_000, traj=traj)
    strict = SliceSampler(slice_len=5)
    assert all(sl == (12_345, 5) for sl in _slices_of(*strict.sample(ctx, 20, gen()), ctx))
    valid = torch.zeros(20_000, dtype=torch.bool)
    valid[:3] = True  # rejection from [0, 20000) nearly always misses: the exact pool is used
    loose = SliceSampler(slice_len=5, strict_length=False)
    few = context(valid, 20_000, traj)
    assert set(_slices_of(*loose.sample(few, 500, gen()), few)) == {(0, 1), (1, 1), (2, 1)}


def test_slice_sampler_argument_errors() -> None:
    ctx = _two_worker_context()
    with pytest.raises(ValueError, match=r"^batch_size 100 is not divisible by slice_len 8$"):
        SliceSampler(slice_len=8).sample(ctx, 100, gen())
    with pytest.raises(ValueError, match=r"^batch_size 10 is not divisible by num_slices 3$"):
        SliceSampler(num_slices=3).sample(ctx, 10, gen())
    no_traj = full(10)
    msg = (
        r"^SliceSampler needs \('collector', 'traj_ids'\) in the stored data; "
        r"collect with track_traj_ids=True$"
    )
    with pytest.raises(ValueError, match=msg):
        SliceSampler(slice_len=2).sample(no_traj, 4, gen())
    both = r"^exactly one of slice_len and num_slices must be given, got slice_len=(None|2) "
    with pytest.raises(ValueError, match=both + r"and num_slices=None$"):
        SliceSampler()
    with pytest.raises(ValueError, match=both + r"and num_slices=3$"):
        SliceSampler(slice_len=2, num_slices=3)
    with pytest.raises(ValueError, match=r"^slice_len must be an int >= 1, got 0$"):
        SliceSampler(slice_len=0)
    with pytest.raises(TypeError, match=r"^num_slices must be an int >= 1, got 2\.5$"):
        SliceSampler(num_slices=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^strict_length must be a bool, got 1$"):
        SliceSampler(slice_len=2, strict_length=1)  # type: ignore[arg-type]


# ------------------------------------------------------------------ validation, make_sampler


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"alpha": -1.0}, ValueError, r"^alpha must be a finite float >= 0, got -1\.0$"),
        ({"alpha": "x"}, TypeError, r"^alpha must be a finite float >= 0, got 'x'$"),
        ({"alpha": True}, TypeError, r"^alpha must be a finite float >= 0, got True$"),
        ({"beta": float("nan")}, ValueError, r"^beta must be a finite float >= 0, got nan$"),
        ({"eps": float("inf")}, ValueError, r"^eps must be a finite float >= 0, got inf$"),
        ({"max_priority": 0}, ValueError, r"^max_priority must be a finite float > 0, got 0$"),
    ],
)
def test_prioritized_constructor_validation(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        PrioritizedSampler(**{"alpha": 0.6, "beta": 0.4, **kwargs})


def test_common_validation() -> None:
    with pytest.raises(TypeError, match=r"^drop_last must be a bool, got 'yes'$"):
        SamplerWithoutReplacement(drop_last="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^capacity must be an int >= 1, got 0$"):
        RandomSampler().reset(0)
    with pytest.raises(TypeError, match=r"^capacity must be an int >= 1, got 1\.5$"):
        RandomSampler().reset(1.5)  # type: ignore[arg-type]
    for sampler in (
        RandomSampler(),
        PrioritizedSampler(alpha=1, beta=1),
        SliceSampler(slice_len=1),
    ):
        sampler.reset(4)
        sampler.extend(torch.arange(4))
        with pytest.raises(ValueError, match=r"^batch_size must be an int >= 1, got 0$"):
            sampler.sample(full(4, traj=torch.zeros(4, dtype=torch.int64)), 0, gen())


def test_make_sampler() -> None:
    assert type(make_sampler(None)) is RandomSampler
    assert type(make_sampler("random")) is RandomSampler
    assert type(make_sampler("without_replacement")) is SamplerWithoutReplacement
    custom = SliceSampler(slice_len=4)
    assert make_sampler(custom) is custom
    rule = "sampler must be None, 'random', 'without_replacement' or a Sampler instance, got "
    with pytest.raises(ValueError, match="^" + re.escape(rule + "'prioritized'") + "$"):
        make_sampler("prioritized")
    with pytest.raises(TypeError, match="^" + re.escape(rule + "3") + "$"):
        make_sampler(3)  # type: ignore[arg-type]


def test_stateless_samplers_round_trip_their_capacity() -> None:
    # (Which names are public is checked once for the whole package in test_public_api.py.)
    slice_params = {"slice_len": 2, "num_slices": None, "strict_length": True}
    for sampler, params in ((RandomSampler(), {}), (SliceSampler(slice_len=2), {"params": slice_params})):
        sampler.reset(8)
        state = sampler.state_dict()
        sampler.reset(4)
        sampler.load_state_dict(state)
        assert sampler.state_dict() == state == {"capacity": 8, **params}
    with pytest.raises(TypeError):
        Sampler()  # type: ignore[abstract]


_FIX = r"; load a state_dict\(\) of a {} created with the same arguments$"


@pytest.mark.parametrize(
    ("saved", "into", "message"),
    [
        (lambda: SliceSampler(slice_len=4), lambda: SliceSampler(slice_len=4, strict_length=False),
         r"^the saved SliceSampler had strict_length=True, this one has strict_length=False"
         + _FIX.format("SliceSampler")),
        (lambda: SliceSampler(slice_len=4), lambda: SliceSampler(num_slices=4),
         r"^the saved SliceSampler had slice_len=4, num_slices=None, this one has slice_len=None, num_slices=4"),
        (lambda: SliceSampler(slice_len=4), lambda: RandomSampler(),
         r"^the saved sampler took arguments \['num_slices', 'slice_len', 'strict_length'\], a RandomSampler takes "
         r"\[\]" + _FIX.format("RandomSampler")),
        (lambda: SamplerWithoutReplacement(), lambda: SamplerWithoutReplacement(drop_last=True),
         r"^the saved SamplerWithoutReplacement had drop_last=False, this one has drop_last=True"),
        (lambda: PrioritizedSampler(alpha=0.6, beta=0.4), lambda: PrioritizedSampler(alpha=0.7, beta=0.4),
         r"^the saved PrioritizedSampler had alpha=0\.6, this one has alpha=0\.7"),
        (lambda: PrioritizedSampler(alpha=0.6, beta=0.4), lambda: SamplerWithoutReplacement(),
         r"^the saved sampler took arguments \['alpha', 'eps', 'max_priority'\], a SamplerWithoutReplacement takes"),
    ],
    ids=["strict_length", "slice_len-vs-num_slices", "slice-into-random", "drop_last", "alpha", "prioritized-into-wor"],
)  # fmt: skip
def test_sampler_states_of_other_classes_or_arguments_are_refused(saved, into, message) -> None:
    source = saved()
    source.reset(8)
    source.extend(torch.arange(8))
    state = source.state_dict()
    sampler = into()
    before = sampler.state_dict()
    with pytest.raises(ValueError, match=message):
        sampler.check_state_dict(state)
    with pytest.raises(ValueError, match=message):
        sampler.load_state_dict(state)
    assert sampler.state_dict() == before  # nothing was loaded


def test_damaged_sampler_states_are_refused_before_loading() -> None:
    sampler = SamplerWithoutReplacement()
    sampler.reset(4)
    good = sampler.state_dict()
    with pytest.raises(TypeError, match=r"^state must be a dict returned by state_dict\(\), got list$"):
        sampler.load_state_dict([])  # type: ignore[arg-type]
    cases = [
        ({}, r"^the sampler state has no 'capacity' entry"),
        ({**good, "capacity": 0}, r"^the sampler state's capacity must be None or an int >= 1, got 0"),
        ({**good, "perm": torch.tensor([0, 9])}, r"^the saved epoch order \('perm'\) must hold indices in \[0, 4\)"),
        ({**good, "pos": 3}, r"^the saved epoch position \('pos'\) must be an int in \[0, 0\], got 3"),
        ({**good, "stale": torch.zeros(5, dtype=torch.bool)}, r"^the saved 'stale' mask must be a bool tensor \[4\]"),
    ]
    for state, message in cases:
        with pytest.raises(ValueError, match=message + ".*; load a state_dict"):
            SamplerWithoutReplacement().load_state_dict(state)  # type: ignore[arg-type]
    prioritized = PrioritizedSampler(alpha=1, beta=1)
    prioritized.reset(4)
    state = prioritized.state_dict()
    for bad, message in (
        ({"priorities": torch.ones(3)}, r"^the saved priorities must be a 1-D tensor of 4 values"),
        ({"priorities": torch.tensor([1.0, -1.0, 0.0, 0.0])}, r"^the saved priorities must be finite and >= 0;"),
        ({"max_priority": float("nan")}, r"^the saved max_priority must be a finite float > 0, got nan;"),
    ):
        with pytest.raises(ValueError, match=message):
            prioritized.check_state_dict({**state, **bad})


def test_older_sampler_states_without_arguments_load_when_their_entries_fit() -> None:
    source = SamplerWithoutReplacement()
    source.reset(6)
    source.sample(full(6), 4, gen())
    state = {k: v for k, v in source.state_dict().items() if k != "params"}
    restored = SamplerWithoutReplacement(drop_last=True)  # arguments cannot be checked: not saved
    restored.load_state_dict(state)
    assert restored._pos == 4 and torch.equal(restored._perm, source._perm)
    SliceSampler(slice_len=3).load_state_dict({"capacity": 6})
    RandomSampler().load_state_dict({"capacity": 6})


def test_state_dicts_before_reset() -> None:
    # a buffer saved before its first write never called reset()
    for make, params in (
        (lambda: SamplerWithoutReplacement(), {"drop_last": False, "shuffle": True}),
        (lambda: PrioritizedSampler(alpha=1, beta=1), {"alpha": 1.0, "eps": 1e-8, "max_priority": 1.0}),
    ):
        state = make().state_dict()
        assert state == {"capacity": None, "params": params}
        fresh = make()
        fresh.load_state_dict(state)
        assert fresh.capacity is None
        fresh.reset(4)
        fresh.extend(torch.arange(4))
        assert fresh.sample(full(4), 4, gen())[0].shape == (4,)

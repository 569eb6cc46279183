"""Slices of consecutive frames for recurrent or sequence models: TorchRL's `SliceSampler`."""

from __future__ import annotations

from typing import Any

import torch

from .._core._errors import BufferEmptyError
from ._samplers import _BOOL, _EMPTY, _INT, _ROUNDS, SampleContext, Sampler, _Batch, _check

__all__ = ("SliceSampler",)

_SLICE_IDS = ("collector", "slice_ids")


class SliceSampler(Sampler):
    """Runs of consecutive frames from single trajectories (TorchRL's `SliceSampler`).

    A slice never crosses an invalid frame, a change of ``ctx.traj_ids`` or ``ctx.worker_ids``,
    a storage row or the end of the index space (it does not wrap around the ring); call a
    longest run of frames without such a break a *segment*. Each call draws ``batch_size //
    L`` slices, ``L`` being ``slice_len`` (or ``batch_size // num_slices``), uniformly among
    the possible ones:

    * ``strict_length=True``: any ``L`` consecutive frames of a segment, so segments shorter
      than ``L`` are never returned and the batch holds exactly ``batch_size`` frames;
    * ``strict_length=False``: the same, plus each segment shorter than ``L`` as one slice,
      whole (it is cut short at the segment's end, as TorchRL cuts a short trajectory), so
      the batch may hold fewer than ``batch_size`` frames.

    The batch is the slices concatenated, each in time order. Info:
    ``("collector", "slice_ids")``, int64, the slice (0, 1, ...) each frame belongs to. It
    tells slices apart even where two of one trajectory lie side by side, e.g. for TorchRL's
    ``split_trajectories(batch, trajectory_key=("collector", "slice_ids"))``.

    Args:
        slice_len: Frames per slice.
        num_slices: Slices per batch.
        strict_length: Return only full-length slices (``False``: also whole segments
            shorter than a slice).

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: Not exactly one of ``slice_len`` and ``num_slices`` is given, or it is < 1.

    Examples:
        >>> traj = torch.tensor([7, 7, 7, 7, 8, 8])  # trajectory 8 is too short
        >>> ctx = SampleContext(torch.ones(6, dtype=torch.bool), 6, 6, traj, None, None)
        >>> SliceSampler(slice_len=3).sample(ctx, 6, torch.Generator().manual_seed(0))[0]
        tensor([0, 1, 2, 1, 2, 3])
        >>> index, info = SliceSampler(slice_len=3, strict_length=False).sample(
        ...     ctx, 6, torch.Generator().manual_seed(3))
        >>> index, info["collector", "slice_ids"]
        (tensor([4, 5, 1, 2, 3]), tensor([0, 0, 1, 1, 1]))
    """

    _state_keys = frozenset()

    def __init__(
        self,
        *,
        slice_len: int | None = None,
        num_slices: int | None = None,
        strict_length: bool = True,
    ) -> None:
        if (slice_len is None) == (num_slices is None):
            rule = "exactly one of slice_len and num_slices must be given"
            raise ValueError(f"{rule}, got {slice_len=} and {num_slices=}")
        self.slice_len = None if slice_len is None else _check("slice_len", slice_len, _INT)
        self.num_slices = None if num_slices is None else _check("num_slices", num_slices, _INT)
        self.strict_length = _check("strict_length", strict_length, _BOOL)

    def _params(self) -> dict[str, Any]:
        return {"slice_len": self.slice_len, "num_slices": self.num_slices,
                "strict_length": self.strict_length}  # fmt: skip

    def sample(self, ctx: SampleContext, batch_size: int, generator: torch.Generator) -> _Batch:
        """Draw slices of consecutive frames; see `Sampler.sample` and the class docstring.

        Raises:
            ValueError: ``batch_size`` is not divisible, or ``ctx.traj_ids`` is None.
            BufferEmptyError: The buffer is empty, or (``strict_length=True``) no slice fits
                in what is stored.
        """
        given = self.slice_len or self.num_slices
        assert given is not None  # the constructor requires one of the two
        if _check("batch_size", batch_size, _INT) % given:
            by = "slice_len" if self.slice_len else "num_slices"
            raise ValueError(f"batch_size {batch_size} is not divisible by {by} {given}")
        length = self.slice_len or batch_size // given
        if ctx.traj_ids is None:
            need = "SliceSampler needs ('collector', 'traj_ids') in the stored data"
            raise ValueError(f"{need}; collect with track_traj_ids=True")
        if ctx.num_valid <= 0:
            raise BufferEmptyError(_EMPTY)
        count, offsets, strict = batch_size // length, torch.arange(length), self.strict_length
        todo = torch.arange(count)
        starts = torch.empty(count, dtype=torch.int64)
        lengths = torch.full((count,), length, dtype=torch.int64)
        high = ctx.size - length + 1 if strict else ctx.size  # candidate starts lie in [0, high)
        for rnd in range(_ROUNDS if high > 0 else 0):
            # Oversample more each round, so low acceptance (short trajectories) stays cheap.
            cand = torch.randint(high, (todo.numel() << min(rnd, 5),), generator=generator)
            joined = _joined(ctx, cand, offsets)  # [candidate, offset]: frame joins its start
            if strict:
                hit = cand[joined.all(1)][: todo.numel()]
                starts[todo[: hit.numel()]] = hit
            else:  # a segment shorter than a slice is drawn at its first frame, whole
                run = joined.long().cumprod(1).sum(1)  # frames before the first break
                ok = (run == length) | ((run > 0) & ~_continues(ctx, cand))
                pick = ok.nonzero().squeeze(1)[: todo.numel()]
                hit = cand[pick]
                starts[todo[: hit.numel()]], lengths[todo[: hit.numel()]] = hit, run[pick]
            todo = todo[hit.numel() :]
            if todo.numel() == 0:
                break
        else:
            pool, pool_lengths = _all_slices(ctx, length, strict)
            if pool.numel() == 0:
                none = f"no trajectory segment of {length} consecutive frames is stored yet"
                raise BufferEmptyError(f"{none}; collect more or lower slice_len")
            pick = torch.randint(pool.numel(), (todo.numel(),), generator=generator)
            starts[todo], lengths[todo] = pool[pick], pool_lengths[pick]
        if strict or bool((lengths == length).all()):
            ids = torch.arange(count).unsqueeze(1).expand(count, length).reshape(-1)
            return (starts.unsqueeze(1) + offsets).reshape(-1), {_SLICE_IDS: ids}
        # Slices of several lengths: number the frames by slice with a cumsum of slice starts
        # (cheaper than repeat_interleave, whose thread pool costs milliseconds on small input).
        first = lengths.cumsum(0) - lengths  # each slice's position in the batch
        marks = torch.zeros(int(lengths.sum()), dtype=torch.int64)
        marks[first[1:]] = 1
        ids = marks.cumsum(0)
        return starts[ids] + torch.arange(ids.numel()) - first[ids], {_SLICE_IDS: ids}


def _continues(ctx: SampleContext, index: torch.Tensor) -> torch.Tensor:
    """Whether frame ``index - 1`` and frame ``index`` may lie in one slice."""
    prev = (index - 1).clamp_min(0)
    assert ctx.traj_ids is not None
    ok = (index > 0) & ctx.valid[prev] & ctx.valid[index] & (ctx.traj_ids[prev] == ctx.traj_ids[index])
    if ctx.worker_ids is not None:
        ok &= ctx.worker_ids[prev] == ctx.worker_ids[index]
    if ctx.row_length is not None:
        ok &= index % ctx.row_length != 0
    return ok


def _joined(ctx: SampleContext, starts: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """bool ``[starts, offsets]``: whether frame ``start + offset`` may share a slice with ``start``."""
    assert ctx.traj_ids is not None
    window = starts.unsqueeze(1) + offsets
    inside = None
    if int(starts.max()) + offsets.numel() > ctx.size:  # some windows run past the stored frames
        inside, window = window < ctx.size, window.clamp_max(ctx.size - 1)
    ok = ctx.valid[window] & (ctx.traj_ids[window] == ctx.traj_ids[starts].unsqueeze(1))
    if inside is not None:
        ok &= inside
    if ctx.worker_ids is not None:
        ok &= ctx.worker_ids[window] == ctx.worker_ids[starts].unsqueeze(1)
    if ctx.row_length is not None:
        ok &= window // ctx.row_length == (starts // ctx.row_length).unsqueeze(1)
    return ok


def _all_slices(ctx: SampleContext, length: int, strict: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact, O(size): every possible slice start and its length."""
    # s starts a full slice iff valid and no break among frames s+1 .. s+length-1.
    size, valid = ctx.size, ctx.valid[: ctx.size]
    cont = _continues(ctx, torch.arange(size))  # frame i continues frame i - 1
    high = max(size - length + 1, 0)
    breaks = (~cont[1:]).long().cumsum(0)
    breaks = torch.cat([torch.zeros(1, dtype=torch.int64), breaks])
    good = valid[:high] & (breaks[length - 1 : size] == breaks[:high])
    pool = good.nonzero().squeeze(1)
    lengths = torch.full_like(pool, length)
    if not strict:  # add each segment shorter than a slice, drawn at its first frame
        heads = valid & ~cont
        segment = heads.long().cumsum(0) - 1
        seg_lengths = torch.bincount(segment[valid], minlength=int(heads.sum()))
        short = seg_lengths < length
        pool = torch.cat([pool, heads.nonzero().squeeze(1)[short]])
        lengths = torch.cat([lengths, seg_lengths[short]])
    return pool, lengths

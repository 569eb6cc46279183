"""Complete-trajectory mode (TorchRL's ``trajs_per_batch``): batches of whole episodes.

`TrajectoryAssembler` takes the ordinary ``[*B, T]`` batches a collector produces, cuts each
env's steps at ``("next", "done")``, carries unfinished episodes over to the next batch and
queues finished ones in completion order. A batch is ``trajs_per_batch`` of them, either
zero-padded to ``[N, max_len]`` with a ``("collector", "mask")`` (``traj_format="padded"``)
or concatenated flat (``"cat"``). With a replay buffer, finished episodes are written as
flat runs of frames, ``trajs_per_write`` per ``extend``; unfinished ones never are.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from .._core._ragged import dense_parts
from .._core._validate import check_int

__all__ = ["TrajectoryAssembler", "check_traj_args"]

_FORMATS = ("padded", "cat")
_TRAJ_IDS = ("collector", "traj_ids")


def check_traj_args(
    trajs_per_batch: Any, traj_format: Any, trajs_per_write: Any, storage_ndim: int | None, *, split_trajs: bool = False
) -> None:
    """Validate the trajectory-mode arguments (before anything is built)."""
    if trajs_per_batch is None:
        if traj_format is not None or trajs_per_write is not None:
            raise ValueError("traj_format and trajs_per_write need trajs_per_batch; set trajs_per_batch or drop them")
        return
    check_int("trajs_per_batch", trajs_per_batch, allow_none=True)
    if split_trajs:
        # split_trajs pads each batch's pieces of episodes into rows before the episodes could
        # be assembled: the padding and the cut pieces would end up in the trajectories.
        raise ValueError(
            "split_trajs=True and trajs_per_batch both cut batches into trajectories, and split_trajs' padded rows "
            "cannot be assembled into whole episodes; drop split_trajs (trajs_per_batch already yields whole "
            "episodes, padded with a mask)"
        )
    if traj_format is not None and traj_format not in _FORMATS:
        raise ValueError(f"traj_format must be 'padded' or 'cat', got {traj_format!r}")

    check_int("trajs_per_write", trajs_per_write, allow_none=True)
    if storage_ndim == 2:
        raise ValueError(
            "trajs_per_batch writes episodes as flat runs of frames; give the replay buffer ndim=1 storage"
        )


class TrajectoryAssembler:
    """Turns fixed-size batches into whole trajectories (see the module docstring)."""

    def __init__(
        self, trajs_per_batch: int, traj_format: str | None, trajs_per_write: int | None, *, drop_open: bool = False
    ) -> None:
        self.n = trajs_per_batch
        self.drop_open = drop_open  # envs reset before every batch: no episode goes on into the next one
        self.format = traj_format or "padded"
        self.per_write = trajs_per_write or 1
        self._partial: dict[int, list[TensorDictBase]] = {}  # env row -> pieces of its open episode
        self._done: deque[TensorDictBase] = deque()

    def reset(self) -> None:
        """Drop unfinished and queued trajectories (the collector's ``reset()``)."""
        self._partial.clear()
        self._done.clear()

    def add(self, batch: TensorDictBase) -> None:
        """Cut a ``[*B, T]`` batch into episodes; queue the finished ones in completion order.

        A ragged batch (workers of unequal lengths) is cut part by part, its env rows numbered
        on from one part to the next.
        """
        finished: list[tuple[int, int, TensorDictBase]] = []  # (end step, env row, episode)
        first = 0
        for part in dense_parts(batch):
            if part.ndim == 1 and part.names[0] != "time":  # flattened (by postproc): no env rows left
                self._group(part, finished)
                continue
            rows = part.reshape(-1, part.shape[-1]) if part.ndim > 1 else part.unsqueeze(0)
            self._cut(rows, first, finished)
            first += rows.shape[0]
        finished.sort(key=lambda item: (item[0], item[1]))
        self._done.extend(traj for _, _, traj in finished)
        if self.drop_open:  # without trajectory ids, the only sign of the reset (TorchRL drops them too)
            self._partial.clear()

    def _cut(self, rows: TensorDictBase, first: int, finished: list[tuple[int, int, TensorDictBase]]) -> None:
        """Cut ``[R, T]`` rows (env rows ``first`` on) into episodes; collect the finished ones.

        An env that abandons an episode (``reset_at_each_iter``, a ``reset()``, a restarted
        worker) starts a new one without a done: its trajectory id changes. The abandoned
        episode's frames are dropped then, never joined to the next episode's.
        """
        done = rows.get(("next", "done")).reshape(rows.shape)
        ends: dict[int, list[int]] = defaultdict(list)
        for i, t in torch.nonzero(done).tolist():
            ends[i].append(t)
        starts: dict[int, list[int]] = defaultdict(list)  # where an episode begins without the last one ending
        ids = rows.get(_TRAJ_IDS, None)
        if ids is not None and ids.numel() == rows.numel():  # one id per frame (not per agent)
            ids = ids.reshape(rows.shape)
            firsts = ids[:, 0].tolist()
            for i in range(rows.shape[0]):
                open_piece = self._partial.get(first + i)
                if open_piece is not None and int(open_piece[-1].get(_TRAJ_IDS)[-1]) != firsts[i]:
                    starts[i].append(0)
            for i, t in torch.nonzero((ids[:, 1:] != ids[:, :-1]) & ~done[:, :-1]).tolist():
                starts[i].append(t + 1)
        for i in range(rows.shape[0]):
            r = first + i
            start = 0
            for pos, is_end in sorted([(e, True) for e in ends[i]] + [(b, False) for b in starts[i]]):
                if not is_end:  # the episode open here was abandoned: drop it
                    self._partial.pop(r, None)
                    start = pos
                    continue
                pieces = self._partial.pop(r, [])
                pieces.append(rows[i, start : pos + 1])
                finished.append((pos, r, _cat(pieces)))
                start = pos + 1
            if start < rows.shape[1]:
                self._partial.setdefault(r, []).append(rows[i, start:].clone())

    def _group(self, flat: TensorDictBase, finished: list[tuple[int, int, TensorDictBase]]) -> None:
        """Assemble a flat batch's frames by trajectory id (TorchRL's way), keeping their order.

        Every env steps in every batch of its workers, so an open episode whose id is missing
        from this batch was abandoned: it is dropped.
        """
        ids = flat.get(_TRAJ_IDS, None)
        if ids is None or ids.numel() != flat.numel():
            raise ValueError(
                f"trajs_per_batch cuts episodes along each env's time dim, and this batch of shape {list(flat.shape)} "
                "(postproc's output) has no time dim and no ('collector', 'traj_ids') to group its frames by; keep "
                "the batch's [..., time] shape in postproc, or keep track_traj_ids=True"
            )
        ids = ids.reshape(-1)
        done = flat.get(("next", "done")).reshape(-1)
        order = torch.argsort(ids, stable=True)
        uniq, counts = torch.unique_consecutive(ids[order], return_counts=True)
        seen = set()
        start = 0
        for tid, count in zip(uniq.tolist(), counts.tolist(), strict=True):
            idx = order[start : start + count]
            start += count
            key = -1 - tid  # apart from the env rows' keys (>= 0) in the same dict
            seen.add(key)
            pieces = self._partial.pop(key, [])
            pieces.append(flat[idx])
            if bool(done[idx[-1]]):
                finished.append((int(idx[-1]), 0, _cat(pieces)))
            else:
                self._partial[key] = pieces
        for key in [k for k in self._partial if k < 0 and k not in seen]:
            del self._partial[key]

    def ready(self) -> bool:
        """Whether a whole batch of trajectories is queued."""
        return len(self._done) >= self.n

    def pop(self) -> TensorDictBase:
        """The next ``trajs_per_batch`` trajectories, padded or concatenated."""
        trajs = [self._done.popleft() for _ in range(self.n)]
        if self.format == "cat":
            return _cat(trajs)
        return _pad(trajs)

    def pop_writes(self) -> list[TensorDictBase]:
        """Finished trajectories grouped ``trajs_per_write`` at a time, as flat frame runs."""
        out = []
        while len(self._done) >= self.per_write:
            out.append(_cat([self._done.popleft() for _ in range(self.per_write)]))
        return out


def _cat(pieces: list[TensorDictBase]) -> TensorDictBase:
    return pieces[0].clone() if len(pieces) == 1 else torch.cat(pieces, 0)


def _pad(trajs: list[TensorDictBase]) -> TensorDictBase:
    longest = max(t.shape[0] for t in trajs)
    out = TensorDict(
        {k: torch.zeros((len(trajs), longest, *v.shape[1:]), dtype=v.dtype)
         for k, v in trajs[0].items(include_nested=True, leaves_only=True)},
        batch_size=[len(trajs), longest],
    )  # fmt: skip
    mask = torch.zeros(len(trajs), longest, dtype=torch.bool)
    for i, t in enumerate(trajs):
        out[i, : t.shape[0]] = t
        mask[i, : t.shape[0]] = True
    out.set(("collector", "mask"), mask)
    out.refine_names(None, "time")
    return out

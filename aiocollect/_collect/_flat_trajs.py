"""Completed trajectories from flat batches grouped by env (``yield_completed_trajectories=True``).

A barrier-free batch holds each env's frames as one contiguous run, in time order. Cutting
each run after every ``("next", "done")`` gives the env's finished episodes; what follows its
last end is kept and continued by the env's run in the next batch. Finished episodes queue in
the order they were cut; a batch is every queued episode, concatenated flat (each one
contiguous), as soon as they hold at least ``min_frames`` frames.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from tensordict import TensorDictBase

__all__ = ["CompletedTrajectories"]

_ENV, _TRAJ = ("collector", "env_id"), ("collector", "traj_ids")


class CompletedTrajectories:
    """The trajectory assembler of `AsyncBatchedCollector` (the collector's ``_traj`` interface).

    Args:
        min_frames: Yield once the finished episodes hold at least this many frames.
    """

    def __init__(self, min_frames: int) -> None:
        self.min_frames = min_frames
        self._open: dict[int, list[TensorDictBase]] = {}  # env -> pieces of its unfinished episode
        self._done: deque[TensorDictBase] = deque()
        self._frames = 0

    def add(self, batch: TensorDictBase) -> None:
        """Cut a flat batch (grouped by env) into episodes; keep each env's unfinished one."""
        env, traj_ids = batch.get(_ENV), batch.get(_TRAJ)
        done = batch.get(("next", "done")).reshape(-1)
        n = env.shape[0]
        # A piece ends after a done frame or where the next frame is another env's.
        ends = done.clone()
        ends[:-1] |= env[1:] != env[:-1]
        ends[-1] = True
        start = 0
        for end in torch.nonzero(ends).flatten().tolist():
            e = int(env[start])
            piece = batch[start : end + 1]
            held = self._open.get(e)
            if held and int(held[0].get(_TRAJ)[0]) != int(traj_ids[start]):
                del self._open[e]  # the env was reset (reset(), reset_at_each_iter): that episode never ends
            if bool(done[end]):
                pieces = self._open.pop(e, [])
                pieces.append(piece)
                traj = pieces[0] if len(pieces) == 1 else torch.cat(pieces, 0)
                self._done.append(traj)
                self._frames += traj.shape[0]
            else:
                self._open.setdefault(e, []).append(piece.clone())
            start = end + 1
        assert start == n

    def ready(self) -> bool:
        """Whether the finished episodes hold at least ``min_frames`` frames."""
        return self._frames >= self.min_frames and bool(self._done)

    def pop(self) -> TensorDictBase:
        """Every finished episode, concatenated flat in the order they were cut."""
        trajs = list(self._done)
        self._done.clear()
        self._frames = 0
        return torch.cat(trajs, 0) if len(trajs) > 1 else trajs[0].clone()

    def pop_writes(self) -> list[TensorDictBase]:
        """With a replay buffer: each finished episode as its own write."""
        trajs = list(self._done)
        self._done.clear()
        self._frames = 0
        return trajs

    def reset(self) -> None:
        """Drop unfinished and queued episodes (the collector's ``reset()``)."""
        self._open.clear()
        self._done.clear()
        self._frames = 0


def as_completed(collector: Any, min_frames: int) -> None:
    """Switch ``collector`` (built) to yielding completed trajectories."""
    collector._traj = CompletedTrajectories(min_frames)
    collector._raw_mode = True
    collector._batch_rb = None

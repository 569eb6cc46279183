"""`ReplayBuffer`'s own writes: ``extend`` and ``extend_nowait``, and the first batch's build.

A batch is checked against the stored layout, rows are reserved (waiting on the rate limiter
for ``extend``), its frames are copied in row-major order and the rows committed. A ragged
batch (a lazy stack of parts with unequal shapes, as workers asked for different
``frames_per_batch`` deliver) is joined first, part after part, so its frames are written
once each, in one reservation.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from .._core._errors import WouldBlock
from .._core._ragged import is_ragged, joined_frames
from .._core._threads import to_thread
from ._reservations import ReservationsMixin
from ._storage import frame_layout

__all__ = ["INLINE_BYTES", "ExtendMixin"]

INLINE_BYTES = 16 << 20  # copies above this size (several ms) run in a worker thread, off the loop


def _flat(td: TensorDictBase, n: int, dims: int) -> dict[Any, torch.Tensor]:
    return {k: v.reshape(n, *v.shape[dims:]) for k, v in td.items(include_nested=True, leaves_only=True)}


class ExtendMixin(ReservationsMixin):
    """Mixed into `ReplayBuffer` (whose state these methods use), to keep its module small."""

    _frame_nbytes: int
    capacity: int

    def _frames_of(self, td: TensorDictBase) -> tuple[TensorDictBase, int, tuple[int, ...], int]:
        """(batch, frame count, batch shape, batch dims); checks the storage's ndim rule.

        A ragged batch comes back joined: ``[n_frames]``, or ``[n_rows, T]`` for ndim=2 storage.
        """
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"extend() takes a TensorDict, got {type(td).__name__}")
        if is_ragged(td):
            td = joined_frames(td, rows=self.storage.ndim == 2)
        dims = td.batch_dims
        if self.storage.ndim == 2:
            if dims < 1:
                raise ValueError(
                    "an ndim=2 buffer stores [..., time] rollouts; extend with a batch that has a time dim"
                )
            row = self.storage.row_length
            if row is not None and td.shape[-1] != row:
                raise ValueError(
                    f"this ndim=2 buffer stores rows of {row} steps, got a batch with {td.shape[-1]}; "
                    "extend with the same time length each time (or use ndim=1)"
                )
        return td, td.numel(), tuple(td.batch_size), dims

    def build(self, layout: Any, row_length: int) -> None:
        """Allocate the storage for frames of ``layout`` (done by the first `extend` otherwise)."""
        with self._lock:
            if self.storage.built:
                return
            self.storage.build(self.capacity, layout, row_length)
            self._frame_nbytes = sum(t[0].numel() * t.element_size() for t in self.storage.tensors.values())
            self._valid = torch.zeros(self.storage.capacity, dtype=torch.bool)
            self.sampler.reset(self.storage.capacity)

    def _checked(self, td: TensorDictBase) -> tuple[TensorDictBase, int, tuple[int, ...], int]:
        self._raise_if_unusable()
        td, n, shape, dims = self._frames_of(td)
        if not self.storage.built:
            self.build(frame_layout(td, dims), shape[-1] if dims else 1)
        self.storage.check(td, dims)
        return td, n, shape, dims

    def extend_nowait(self, td: TensorDictBase) -> torch.Tensor:
        """`extend` without waiting (safe from any thread); the copy runs in the calling thread.

        Raises:
            WouldBlock: The rate limiter (or writers holding the whole ring) says wait.
        """
        td, n, shape, dims = self._checked(td)
        res = self.try_reserve(n, shape)
        if res is None:
            raise WouldBlock("extend_nowait() would wait: the learner is behind samples_per_insert; await extend()")
        try:
            self.storage.write(res.pieces, _flat(td, n, dims))
        except BaseException:
            self.abort(res)
            raise
        self.commit(res)
        return res.index

    async def extend(self, td: TensorDictBase) -> torch.Tensor:
        """Append a batch (any batch shape; frames are stored in row-major order).

        Waits while the rate limiter says the learner is behind, or while writers in flight
        hold the whole ring. A ragged batch (a lazy stack of parts with unequal shapes, such
        as ``MultiSyncCollector`` gives for a ``frames_per_batch`` list) is stored part after
        part.

        Args:
            td: A TensorDict of frames. The first call fixes the keys, shapes and dtypes.

        Returns:
            The ring indices the frames were written to.

        Raises:
            ValueError: The batch does not match the stored layout, or exceeds the capacity;
                or it is ragged with parts of different time lengths for ndim=2 storage.
        """
        td, n, shape, dims = self._checked(td)
        res = await self.reserve(n, shape)
        try:
            flat = _flat(td, n, dims)
            if n * self._frame_nbytes > INLINE_BYTES:
                await to_thread(self.storage.write, res.pieces, flat)
            else:
                self.storage.write(res.pieces, flat)
        except BaseException:
            self.abort(res)
            raise
        self.commit(res)
        return res.index

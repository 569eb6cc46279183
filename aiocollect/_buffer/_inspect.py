"""Reading a `ReplayBuffer` as TorchRL users do: ``rb[i]``, ``rb[:n]`` (oldest first), iteration.

Indexing reads the frames in the order they were written, skipping frames that are being
written (reserved, not yet committed) or were dropped as stale: ``rb[0]`` is the oldest
frame stored, ``rb[-1]`` the newest, ``rb[:len(rb)]`` everything. It copies the frames out
under the buffer's lock, so a concurrent writer never shows up half-written.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import torch

from .._core._errors import BufferClosedError

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = ["InspectMixin"]


class InspectMixin:
    """Mixed into `ReplayBuffer` (whose state these methods read)."""

    _lock: Any
    _valid: torch.Tensor
    _size: int
    _cursor: int
    storage: Any

    def _ordered_index(self) -> torch.Tensor:
        """Storage indices of the stored frames, oldest first (call under the lock)."""
        size = self._size
        if size == 0 or not self.storage.built:
            return torch.zeros(0, dtype=torch.int64)
        cap = self.storage.capacity
        order = torch.arange(size) if size < cap else (torch.arange(cap) + self._cursor) % cap
        return order[self._valid[order]]

    def __getitem__(self, index: int | slice | torch.Tensor | list[int]) -> TensorDictBase:
        """The frames at ``index`` in write order (an int gives one frame, anything else a batch).

        Args:
            index: An int, a slice, or an int tensor/list of positions, over ``range(len(rb))``.

        Raises:
            IndexError: An int position outside ``[-len(rb), len(rb))``.
        """
        with self._lock:
            order = self._ordered_index()
            if isinstance(index, int):
                n = order.numel()
                if not -n <= index < n:
                    raise IndexError(f"replay buffer index {index} is out of range for a buffer of {n} frames")
                return self.storage.gather(order[index : index + 1 or None])[0]
            chosen = order[torch.as_tensor(index) if isinstance(index, list) else index]
            return self.storage.gather(chosen.reshape(-1))

    def __aiter__(self) -> AsyncIterator[TensorDictBase]:
        """Sampled batches, ``await sample()`` after ``await sample()``, until the buffer is closed."""
        return self._sampled_batches()

    async def _sampled_batches(self) -> AsyncIterator[TensorDictBase]:
        while True:
            try:
                batch = await self.sample()  # type: ignore[attr-defined]
            except BufferClosedError:
                return
            yield batch

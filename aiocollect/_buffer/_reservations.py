"""The writers' side of `ReplayBuffer`: reserve rows, fill them, commit (or abort) them.

A writer (``extend``, an in-process collector, or a worker process writing into shared
storage) first reserves a run of ring rows, which leaves sampling at once, fills them
outside any lock, and commits them, which makes them sampleable and wakes waiters. A
reservation is taken only when the rate limiter allows the insert (checked under the lock,
so concurrent writers cannot both slip through).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

__all__ = ["Reservation", "ReservationsMixin"]

_POLICY_VERSION = ("collector", "policy_version")


@dataclass
class Reservation:
    """Rows handed to a writer: ``pieces`` of the ring, ``n`` frames, shaped like ``batch_shape``."""

    pieces: list[tuple[int, int]]
    index: torch.Tensor
    batch_shape: tuple[int, ...]

    @property
    def n(self) -> int:
        return int(self.index.numel())


class ReservationsMixin:
    """Mixed into `ReplayBuffer` (whose state these methods use), to keep its module small."""

    _lock: Any
    _notifier: Any
    storage: Any
    sampler: Any
    max_policy_lag: int | None
    _valid: torch.Tensor
    _num_valid: int
    _cursor: int
    _size: int
    _in_flight: int
    _written: int
    _policy_version: int
    _stale_dropped: int
    _insert_wait: float

    if TYPE_CHECKING:  # provided by ReplayBuffer

        def _raise_if_unusable(self) -> None: ...
        def _insert_allowed(self, n: int) -> bool: ...
        async def _wait(self, predicate: Callable[[], bool]) -> float: ...

    async def reserve(self, n: int, batch_shape: tuple[int, ...]) -> Reservation:
        """Wait until ``n`` frames may be written, then hand out the rows to write them to.

        The rows are removed from sampling until `commit`. Used by `extend` and by collectors.
        """
        return (await self.reserve_many([(n, batch_shape)]))[0]

    def try_reserve(self, n: int, batch_shape: tuple[int, ...]) -> Reservation | None:
        """`reserve` without waiting: ``None`` if the rate limiter or capacity says wait."""
        with self._lock:
            self._raise_if_unusable()
            if n > self.storage.capacity or not self._insert_allowed(n):
                return None
            return self._reserve_now(n, batch_shape)

    async def reserve_many(self, requests: list[tuple[int, tuple[int, ...]]]) -> list[Reservation]:
        """Reserve rows for several batches at once (one wait, so none is held while waiting)."""
        total = sum(n for n, _ in requests)
        self._raise_if_unusable()
        if total > self.storage.capacity:
            what = f"a batch of {total} frames" if len(requests) == 1 else f"{len(requests)} batches of {total} frames"
            raise ValueError(f"{what} does not fit in a buffer of {self.storage.capacity} frames; raise capacity")
        while True:
            waited = await self._wait(lambda: self._insert_allowed(total))
            with self._lock:
                self._insert_wait += waited
                self._raise_if_unusable()
                if self._insert_allowed(total):  # another writer may have been first
                    return [self._reserve_now(n, shape) for n, shape in requests]

    def _reserve_now(self, n: int, batch_shape: tuple[int, ...]) -> Reservation:
        cap, start = self.storage.capacity, self._cursor
        first = min(n, cap - start)
        pieces = [(start, first)] + ([(0, n - first)] if n > first else [])
        index = (
            torch.cat([torch.arange(s, s + k) for s, k in pieces])
            if len(pieces) > 1
            else torch.arange(start, start + n)
        )
        self._cursor = (start + n) % cap
        self._size = cap if self._size == cap or start + n >= cap else max(self._size, start + n)
        self._invalidate(index)
        self._in_flight += n
        return Reservation(pieces, index, tuple(batch_shape))

    def _invalidate(self, index: torch.Tensor) -> None:
        dropped = int(self._valid[index].sum())
        if dropped:
            self._valid[index] = False
            self._num_valid -= dropped
        self.sampler.invalidate(index)

    def _drop_stale(self, index: torch.Tensor) -> None:
        versions = self.storage.host.get(_POLICY_VERSION)
        if versions is None or self.max_policy_lag is None:
            return
        stale = index[versions[index] < self._policy_version - self.max_policy_lag]
        if stale.numel():
            stale = stale[self._valid[stale]]
            self._stale_dropped += int(stale.numel())
            self._invalidate(stale)

    def commit(self, reservation: Reservation, *, drop_unfilled: bool = False) -> int:
        """Make the reserved rows (now written) available to sampling, and wake waiters.

        With ``drop_unfilled``, frames whose ``("collector", "policy_version")`` is ``-1``
        (steps a preempted batch never collected) stay out of the buffer.

        Returns:
            The number of frames committed.
        """
        with self._lock:
            index = reservation.index
            self._in_flight -= reservation.n
            self.storage.sync_host(index)
            versions = self.storage.host.get(_POLICY_VERSION)
            if drop_unfilled and versions is not None:
                index = index[versions[index] >= 0]
            self._valid[index] = True
            self._num_valid += index.numel()
            self._written += index.numel()
            self.sampler.extend(index)
            if self.max_policy_lag is not None:
                self._drop_stale(index)
        self._notifier.notify_all()
        return int(index.numel())

    def abort(self, reservation: Reservation) -> None:
        """Give up a reservation whose writer failed: its rows stay empty until overwritten."""
        with self._lock:
            self._in_flight -= reservation.n
        self._notifier.notify_all()

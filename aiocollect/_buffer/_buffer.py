"""ReplayBuffer: an awaitable ring of frames with Reverb-style rate limiting.

Writers (``extend``, or collectors whose workers write in place) first *reserve* a run of
rows, fill it, then *commit* it; samplers only ever see committed rows. Every piece of
shared state is guarded by one lock, and every wait goes through a `Notifier`, so a
collector and a trainer may run on different event loops or threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio
import torch
from tensordict import TensorDictBase

from .._core._errors import BufferClosedError, BufferEmptyError, BufferTimeoutError, WouldBlock
from .._core._notify import Notifier
from .._core._stats import BufferStats
from .._core._threads import to_thread
from .._core._validate import check_int
from ._buffer_io import BufferPersistence
from ._extend import INLINE_BYTES, ExtendMixin
from ._inspect import InspectMixin
from ._ratelimit import RateLimiter
from ._reservations import Reservation
from ._samplers import SampleContext, make_sampler
from ._storage import Storage, make_storage
from ._writers import Writers, WritersMixin, check_timeout

__all__ = ["ReplayBuffer", "Reservation"]

_POLICY_VERSION = ("collector", "policy_version")


class ReplayBuffer(ExtendMixin, InspectMixin, BufferPersistence, WritersMixin):
    """A replay buffer whose writers and readers ``await`` each other instead of polling.

    Frames live in a preallocated ring (`MemoryStorage` by default, `SharedMemoryStorage`
    when worker processes write into it, `MemmapStorage` for more than RAM), built from the
    first batch. ``sample`` waits until ``min_size`` frames are stored; with
    ``samples_per_insert`` the buffer also keeps the ratio of sampled to inserted frames
    near that value, like Reverb's ``SampleToInsertRatio``: ``extend`` waits when the learner
    falls behind and ``sample`` waits when the collectors fall behind (by more than
    ``tolerance`` frames either way, checked before each call). Nothing is dropped or polled.

    Collectors take it as ``replay_buffer=`` and then write into it directly. The buffer is
    safe to use from several event loops and threads at once.

    Args:
        capacity: Frames the ring holds; older frames are overwritten first.
        batch_size: Default ``batch_size`` of `sample`.
        storage: ``None``/``"memory"``, ``"shared"``, ``"memmap"`` or a `Storage` instance.
        sampler: ``None``/``"random"``, ``"without_replacement"`` or a sampler instance
            (`RandomSampler`, `SamplerWithoutReplacement`, `PrioritizedSampler`, `SliceSampler`).
        min_size: `sample` waits until this many frames have been written.
        samples_per_insert: Target ratio of sampled frames to inserted frames (beyond
            ``min_size``); ``None`` disables rate limiting.
        tolerance: How far (in frames) sampling may run ahead of or behind the target
            ratio; default ``2 * max(batch_size or 1, samples_per_insert)``.
        transform: A callable applied to every sampled TensorDict (e.g. moving it to a device).
        max_policy_lag: Drop frames collected with a policy more than this many versions
            older than `policy_version` (``None`` keeps everything).
        seed: Seed of the sampling generator (``None``: nondeterministic).

    Examples:
        >>> import anyio, torch
        >>> from tensordict import TensorDict
        >>> from aiocollect import ReplayBuffer
        >>> async def main():
        ...     rb = ReplayBuffer(1000, batch_size=4, seed=0)
        ...     await rb.extend(TensorDict(observation=torch.arange(10.0), batch_size=[10]))
        ...     return (await rb.sample())["observation"].shape
        >>> anyio.run(main)
        torch.Size([4])
    """

    #: Collectors (and their workers) write straight into this buffer's rows.
    direct_writes = True

    def __init__(
        self,
        capacity: int,
        *,
        batch_size: int | None = None,
        storage: Storage | str | None = None,
        sampler: Any = None,
        min_size: int = 0,
        samples_per_insert: float | None = None,
        tolerance: float | None = None,
        transform: Callable[[TensorDictBase], TensorDictBase] | None = None,
        max_policy_lag: int | None = None,
        seed: int | None = None,
    ) -> None:
        self.capacity = check_int("capacity", capacity)
        self.batch_size = check_int("batch_size", batch_size, allow_none=True)
        self.min_size = check_int("min_size", min_size, minimum=0)
        if self.min_size > capacity:
            raise ValueError(f"min_size ({min_size}) must not exceed capacity ({capacity}); lower min_size")
        self._limiter = RateLimiter.build(self.min_size, samples_per_insert, tolerance, self.batch_size)
        self.samples_per_insert, self.tolerance = self._limiter.samples_per_insert, self._limiter.tolerance
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be a callable taking and returning a TensorDict, got {transform!r}")
        self.transform = transform
        self.max_policy_lag = check_int("max_policy_lag", max_policy_lag, allow_none=True, minimum=0)
        check_int("seed", seed, allow_none=True, minimum=0)
        self.storage = make_storage(storage)
        self.sampler = make_sampler(sampler)
        self._notifier = Notifier()
        self._lock = self._notifier.lock
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        self._valid = torch.zeros(0, dtype=torch.bool)
        self._num_valid = self._cursor = self._size = self._in_flight = 0
        self._written = self._sampled = self._stale_dropped = 0
        self._policy_version = 0
        self._lag_sum = self._lag_count = self._lag_max = 0
        self._insert_wait = self._sample_wait = 0.0
        self._error: BaseException | None = None
        self._error_delivered = False
        self._writers = Writers()
        self._frame_nbytes = 0
        self._closed = False

    # -- counters ----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Frames stored and available to sample."""
        return self._num_valid

    @property
    def write_count(self) -> int:
        """Frames ever committed to the buffer."""
        return self._written

    @property
    def policy_version(self) -> int:
        """The newest policy version the buffer knows of (collectors keep it up to date)."""
        return self._policy_version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        with self._lock:
            self._policy_version = max(self._policy_version, int(version))
            if self.max_policy_lag is not None and self._num_valid:
                self._drop_stale(torch.nonzero(self._valid).flatten())
        self._notifier.notify_all()

    def stats(self) -> BufferStats:
        """Return a `BufferStats` snapshot."""
        with self._lock:
            beyond = self._written - self.min_size
            return BufferStats(
                size=self._num_valid, capacity=self.storage.capacity, write_count=self._written,
                sample_count=self._sampled, in_flight=self._in_flight,
                samples_per_insert=self._sampled / beyond if beyond > 0 else 0.0,
                insert_wait_seconds=self._insert_wait, sample_wait_seconds=self._sample_wait,
                policy_version=self._policy_version, stale_dropped=self._stale_dropped,
                sampled_policy_lag_mean=self._lag_sum / self._lag_count if self._lag_count else 0.0,
                sampled_policy_lag_max=self._lag_max,
            )  # fmt: skip

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.storage.kind} storage"
        return (
            f"<ReplayBuffer [{state} | {self._num_valid}/{self.capacity} frames | written: {self._written} "
            f"| sampled: {self._sampled} | sampler: {type(self.sampler).__name__}]>"
        )

    # -- rate limiting -------------------------------------------------------------------------
    def _raise_if_unusable(self) -> None:
        if self._error is not None:
            self._error_delivered = True
            raise self._error
        if self._closed:
            raise BufferClosedError("this ReplayBuffer was closed; create a new one")

    def _insert_allowed(self, n: int) -> bool:
        if self._error is not None or self._closed:
            return True  # wake up to raise
        if self._in_flight + n > (self.storage.capacity or self.capacity):
            return False
        return self._limiter.insert_allowed(self._written + self._in_flight, self._sampled)

    def _sample_allowed(self) -> bool:
        if self._error is not None or self._closed:
            return True
        # Once every collector that fed the buffer has finished, nothing will be inserted
        # any more: the ratio no longer holds samplers back (min_size still does).
        done = self._writers.all_done
        return self._num_valid > 0 and self._limiter.sample_allowed(self._written, self._sampled, ratio=not done)

    async def _wait(self, predicate: Callable[[], bool]) -> float:
        """Wait for ``predicate``; return the seconds spent blocked on it (0.0 if it held at once)."""
        return await self._notifier.wait_until(predicate)

    # -- sampling ------------------------------------------------------------------------------
    def _batch_size(self, batch_size: int | None) -> int:
        bs = self.batch_size if batch_size is None else batch_size
        if bs is None:
            raise ValueError("sample() needs a batch_size: pass one here or to ReplayBuffer(batch_size=...)")
        return check_int("batch_size", bs)

    def _context(self) -> SampleContext:
        t = self.storage.host
        return SampleContext(
            valid=self._valid, num_valid=self._num_valid, size=self._size,
            traj_ids=t.get(("collector", "traj_ids")), worker_ids=t.get(("collector", "worker_id")),
            row_length=self.storage.row_length,
        )  # fmt: skip

    def _sample_now(self, batch_size: int, *, nowait: bool = False) -> TensorDictBase | None:
        """Sample under the lock; ``None`` if sampling is not allowed right now.

        With ``nowait`` a refusal raises instead: `BufferEmptyError` or `WouldBlock`.
        """
        with self._lock:
            self._raise_if_unusable()
            if nowait and (self._num_valid == 0 or self._written < self.min_size):
                raise BufferEmptyError(
                    f"sample() called on a buffer holding {self._num_valid} frames (min_size {self.min_size}); "
                    f"await buffer.wait_for({max(self.min_size, 1)}) first"
                )
            if not self._sample_allowed():
                if nowait:
                    raise WouldBlock(
                        "sample_nowait() would wait: sampling is ahead of samples_per_insert; await sample()"
                    )
                return None  # another sampler got there first
            index, info = self.sampler.sample(self._context(), batch_size, self._generator)
            td = self.storage.gather(index)
            self._sampled += index.numel()  # SliceSampler(strict_length=False) may return fewer
            versions = td.get(_POLICY_VERSION, None)
            if versions is not None and versions.numel():
                lag = self._policy_version - versions
                total, worst = torch.stack([lag.sum(), lag.max()]).tolist()
                self._lag_sum, self._lag_count = self._lag_sum + total, self._lag_count + lag.numel()
                self._lag_max = max(self._lag_max, worst)
        self._notifier.notify_all()  # a sample may let a rate-limited writer go on
        td.set("index", index)
        for k, v in info.items():
            td.set(k, v)
        return td if self.transform is None else self.transform(td)

    async def sample(self, batch_size: int | None = None, *, timeout: float | None = None) -> TensorDictBase:
        """Sample frames, waiting until ``min_size`` is reached and the rate limiter allows it.

        Once every collector feeding the buffer has finished, only ``min_size`` is waited
        for: nothing more will be inserted, so the ratio no longer holds sampling back. A
        sample that the stored frames cannot serve then raises `BufferStarvedError` at once
        instead of waiting for frames that will never come.

        Args:
            batch_size: Frames to sample (default: the buffer's ``batch_size``).
            timeout: Seconds to wait at most (``None``: no limit), as Reverb's
                ``rate_limiter_timeout_ms``.

        Returns:
            A TensorDict ``[batch_size]`` with the stored keys, ``"index"`` (ring positions) and
            the sampler's extras (``"_weight"`` for `PrioritizedSampler`,
            ``("collector", "slice_ids")`` for `SliceSampler`, which with
            ``strict_length=False`` may return fewer than ``batch_size`` frames).

        Raises:
            WorkerError: A collector feeding this buffer in the background failed.
            BufferStarvedError: Every collector registered with the buffer has finished and
                the stored frames cannot serve the sample (below ``min_size``, say); a
                collector's failure is its ``__cause__``.
            BufferTimeoutError: ``timeout`` passed first (a `TimeoutError`).
        """
        bs = self._batch_size(batch_size)
        limit = check_timeout(timeout, "sample_nowait()")
        with anyio.move_on_after(math.inf if limit is None else limit):
            return await self._sample_waiting(bs)
        with self._lock:
            raise BufferTimeoutError(self._account("sample()", self._sample_need(bs), limit))

    async def _sample_waiting(self, bs: int) -> TensorDictBase:
        done = self._writers
        while True:
            self._raise_if_unusable()
            waited = await self._wait(lambda: self._sample_allowed() or done.all_done)
            with self._lock:
                self._sample_wait += waited
                written = self._written
            try:
                if bs * self._frame_nbytes > INLINE_BYTES:
                    # Shielded: a sample taken in the thread and then abandoned would be lost.
                    with anyio.CancelScope(shield=True):
                        td = await to_thread(self._sample_now, bs)
                else:
                    td = self._sample_now(bs)
                if td is not None:
                    return td
                with self._lock:
                    if done.all_done and not self._sample_allowed():
                        raise self._starved("sample()", self._sample_need(bs))
            except BufferEmptyError:
                # The sampler needs more than is stored (e.g. a whole slice): wait for a write.
                with self._lock:
                    if done.all_done:
                        sampler = type(self.sampler).__name__
                        need = (f"frames its {sampler} can return ({bs} asked)", "lower batch_size or the slice length")
                        raise self._starved("sample()", need) from None

                def written_since(w: int = written) -> bool:
                    return self._written > w or self._error is not None or self._closed or done.all_done

                waited = await self._wait(written_since)
                with self._lock:
                    self._sample_wait += waited

    def sample_nowait(self, batch_size: int | None = None) -> TensorDictBase:
        """Sample without waiting (safe from any thread).

        Raises:
            BufferEmptyError: Nothing is stored yet (or less than ``min_size``), or the
                sampler finds nothing it may return (e.g. no whole slice).
            WouldBlock: The rate limiter says the collectors are behind.
        """
        td = self._sample_now(self._batch_size(batch_size), nowait=True)
        assert td is not None
        return td

    async def wait_for(self, n: int, *, timeout: float | None = None) -> None:
        """Wait until at least ``n`` frames are stored (``len(buffer) >= n``).

        Args:
            n: Frames to wait for (at most the capacity).
            timeout: Seconds to wait at most (``None``: no limit).

        Raises:
            BufferStarvedError: Every collector registered with the buffer has finished with
                fewer than ``n`` frames stored.
            BufferTimeoutError: ``timeout`` passed first (a `TimeoutError`).
        """
        n = check_int("n", n, minimum=0)
        limit = check_timeout(timeout)
        cap = self.storage.capacity or self.capacity  # ndim=2 storage rounds down to whole rows
        if n > cap:
            raise ValueError(f"wait_for({n}) can never return: the buffer holds at most {cap} frames")
        need = (f"{n} stored frames", "wait for fewer frames, or raise the collectors' total_frames")
        self._raise_if_unusable()
        with anyio.move_on_after(math.inf if limit is None else limit):
            await self._wait(
                lambda: self._num_valid >= n or self._error is not None or self._closed or self._writers.all_done
            )
            self._raise_if_unusable()
            with self._lock:
                if self._num_valid < n:
                    raise self._starved(f"wait_for({n})", need)
            return
        with self._lock:
            raise BufferTimeoutError(self._account(f"wait_for({n})", need, limit))

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor | float) -> None:
        """Set the priorities of frames (``index`` as returned in a sample's ``"index"``)."""
        update = getattr(self.sampler, "update_priority", None)
        if update is None:
            raise TypeError(
                f"update_priority() needs a PrioritizedSampler, this buffer uses {type(self.sampler).__name__}"
            )
        with self._lock:
            update(index, priority)

    # -- failure and closing -------------------------------------------------------------------
    def fail(self, error: BaseException) -> None:
        """Record a producer's failure: every later `sample`/`extend`/`wait_for` raises it."""
        with self._lock:
            if self._error is None:
                self._error = error
        self._notifier.notify_all()

    async def aclose(self) -> None:
        """Release the storage and wake every waiter (they raise `BufferClosedError`). Idempotent."""
        self.close_now()

    @property
    def closed(self) -> bool:
        """Whether `aclose` (or ``close``) was called."""
        return self._closed

    def close_now(self, *, blocking: bool = True) -> None:
        """Synchronous `aclose` (also used by the blocking twin and garbage collection).

        With ``blocking=False`` (finalizers) it gives up instead of waiting for the lock that
        another thread holds; the storage is then freed with the buffer.
        """
        if not self._lock.acquire(blocking=blocking):
            return
        try:
            if self._closed:
                return
            self._closed = True
            self.storage.close()
            self._notifier.notify_all()  # the lock is re-entrant: no second wait for it
        finally:
            self._lock.release()

    def __del__(self) -> None:
        # Memory needs no warning (it is freed with the object); a temporary memmap
        # directory does need deleting.
        if not getattr(self, "_closed", True):
            self.close_now(blocking=False)

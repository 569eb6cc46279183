"""What every async collector shares: ``async with`` ownership, the batch stream, shutdown.

A subclass provides four hooks: ``_start`` (build envs or workers), ``_collect_one`` (one
batch), ``_close_resources`` (async, bounded teardown) and ``_close_now`` (best effort from
``__del__``). Everything else, including how batches reach ``async for``, lives here once.
"""

from __future__ import annotations

import math
import os
import warnings
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup
from tensordict import TensorDictBase

from .._core._errors import CollectorClosedError
from .._core._stats import CollectorStats
from ._background import BackgroundMixin
from ._pipeline import BatchPipeline
from ._trajs import TrajectoryAssembler, check_traj_args

__all__ = ["CollectorLifecycle"]


_NOTHING = object()  # the frame budget ran out before a whole batch of trajectories


class _Failure:
    """An exception travelling from the producer task to the consumer through the stream."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class CollectorLifecycle(BackgroundMixin, BatchPipeline):
    """Base of the async collectors (not public): lifecycle, iteration and statistics."""

    _total_frames: float
    _max_queued_batches: int
    _frames_per_batch: int

    def _init_lifecycle(
        self,
        total_frames: float,
        frames_per_batch: int,
        max_queued_batches: int,
        replay_buffer: Any = None,
        *,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        extend_buffer: bool = True,
        postprocessing: bool = False,
    ) -> None:
        self._init_background(replay_buffer)
        rb = self._rb
        check_traj_args(trajs_per_batch, traj_format, trajs_per_write, rb.storage.ndim if rb is not None else None)
        if not isinstance(extend_buffer, bool):
            raise TypeError(f"extend_buffer must be a bool, got {extend_buffer!r}")
        if not extend_buffer and rb is not None and (postprocessing or trajs_per_batch is not None):
            raise ValueError(
                "extend_buffer=False writes frames into the buffer step by step, without postproc, split_trajs "
                "or trajs_per_batch; drop those or keep extend_buffer=True"
            )
        self._traj = (
            None if trajs_per_batch is None else TrajectoryAssembler(trajs_per_batch, traj_format, trajs_per_write)
        )
        # Raw mode: the collector hands back plain batches, and _next_item turns them into
        # trajectories or step-by-step buffer writes. Otherwise batches go to the buffer whole.
        self._raw_mode = self._traj is not None or (rb is not None and not extend_buffer)
        self._batch_rb = None if self._raw_mode else rb
        self._total_frames = total_frames
        self._frames_per_batch = frames_per_batch
        self._max_queued_batches = max_queued_batches
        self._frames = 0
        self._batches = 0
        self._failure: BaseException | None = None  # what ended collection, for the replay buffer's account
        self._collect_time = 0.0
        self._closed = False
        self._started = False
        self._tg: TaskGroup | None = None
        self._producer_scope: anyio.CancelScope | None = None

    # -- hooks -------------------------------------------------------------------------------
    async def _start(self) -> None:
        raise NotImplementedError

    async def _collect_one(self) -> TensorDictBase:
        raise NotImplementedError

    async def _close_resources(self) -> None:
        raise NotImplementedError

    def _close_now(self) -> None:
        raise NotImplementedError

    def _policy_version(self) -> int:
        raise NotImplementedError

    def _stop_requested(self) -> None:
        """Called first on shutdown, synchronously: tell running work to stop."""

    # -- lifecycle ---------------------------------------------------------------------------
    async def _ensure_started(self) -> None:
        if self._closed:
            raise CollectorClosedError(f"this {type(self).__name__} was shut down; create a new one")
        if not self._started:
            try:
                await self._start()
            except BaseException:
                # However start-up ends early (an error, or cancellation while workers are
                # still spawning), what was already started is torn down now: nothing else
                # holds on to a collector that never started.
                await self.aclose()
                raise
            self._started = True
            if self._rb is not None:
                self._writer = self._rb.attach_writer(type(self).__name__)
                self._writing = True

    async def __aenter__(self) -> Any:
        if self._tg is not None:
            raise RuntimeError(f"this {type(self).__name__} is already open; 'async with' it only once")
        try:
            await self._ensure_started()
        except BaseException:
            await self.aclose()
            raise
        n = self._max_queued_batches
        self._send, self._recv = anyio.create_memory_object_stream[Any](n + 1)
        self._demand = anyio.Semaphore(n)
        self._producer_scope = anyio.CancelScope()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._produce)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None and self._producer_scope is not None
        self._stop_requested()
        self._producer_scope.cancel()
        self._stop_background()
        try:
            # The producer never blocks on cancellation (thread calls are abandoned, worker
            # waits are fd waits), so this returns at once. The body's exception is not
            # passed in: the task group would wrap it in an ExceptionGroup, and the producer
            # never raises (its errors travel through the stream).
            await self._tg.__aexit__(None, None, None)
        finally:
            self._recv.close()
            await self.aclose()
        err = self._undelivered_error()
        if err is not None and exc_type is None:
            self._bg_error = None
            raise err
        return None

    async def aclose(self) -> None:
        """Stop collecting and release every resource (envs, threads, workers). Idempotent.

        Teardown is shielded from cancellation and bounded by ``shutdown_timeout``.
        """
        if self._closed:
            return
        self._closed = True
        self._writer_done()
        self._stop_requested()
        # Only the producer is cancelled: the task group's own scope also covers the user's
        # 'async with' body, which aclose() must not cancel.
        if self._producer_scope is not None:
            self._producer_scope.cancel()
        self._stop_background()
        with anyio.CancelScope(shield=True):
            await self._close_resources()

    def _finalize(self) -> bool:
        """Close synchronously, without waiting on anything (garbage collection); True if it was open."""
        if not getattr(self, "_started", False) or self._closed:
            return False
        self._closed = True
        self._writer_done()
        self._stop_requested()
        self._close_now()
        return True

    def __del__(self) -> None:
        if getattr(self, "_started", False) and not self._closed:
            warnings.warn(f"unclosed {self!r}; use 'async with' or call aclose()", ResourceWarning, stacklevel=1)
            self._finalize()

    def _writer_done(self) -> None:
        """Tell the replay buffer this collector will write no more, and how it ended (once)."""
        if getattr(self, "_writing", False):
            self._writing = False
            error = self._failure or self._bg_error
            if error is not None:
                ending = f"failed with {type(error).__name__}: {error}"
            elif self._exhausted():
                ending = f"spent its frame budget of {int(self._total_frames)} frames"
            else:
                ending = f"was shut down after {self._frames} frames"
            self._rb.detach_writer(self._writer, ending=ending, error=error)

    # -- iteration ---------------------------------------------------------------------------
    def _exhausted(self) -> bool:
        return self._frames >= self._total_frames

    async def _next_item(self) -> Any:
        """One item of iteration: a batch, ``None`` (written to the buffer) or `_NOTHING`."""
        if not self._raw_mode:
            return await self._collect_one()
        rb = self._rb
        while not self._exhausted():
            raw = await self._collect_one()
            if raw is None:  # paused before anything was collected
                return None
            if self._traj is None:  # extend_buffer=False: one write per time step, as TorchRL's add
                for t in range(raw.shape[-1]):
                    await rb.extend(raw[..., t])
                return None
            self._traj.add(raw)
            if rb is not None:
                for group in self._traj.pop_writes():
                    await rb.extend(group)
                return None
            if self._traj.ready():
                return self._traj.pop()
        return _NOTHING

    async def _produce(self) -> None:
        try:
            with self._producer_scope:  # type: ignore[union-attr]
                while not self._exhausted() and not self._closed:
                    await self._demand.acquire()
                    item = await self._next_item()
                    if item is _NOTHING:
                        break
                    await self._send.send(item)
        except Exception as exc:
            self._failure = exc
            try:
                await self._send.send(_Failure(exc))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
        finally:
            if self._exhausted():
                self._writer_done()
            self._send.close()

    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> TensorDictBase:
        self._check_not_background()
        if self._tg is not None:
            if self._closed:
                raise StopAsyncIteration
            self._demand.release()
            try:
                item = await self._recv.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise StopAsyncIteration from None
            if isinstance(item, _Failure):
                raise item.exc
            return item
        if self._exhausted():
            await self.aclose()
            raise StopAsyncIteration
        if self._closed:
            raise CollectorClosedError(f"this {type(self).__name__} was shut down; create a new one")
        try:
            item = await self._next_item()
        except Exception as exc:
            self._failure = exc
            await self.aclose()
            raise
        if item is _NOTHING:
            await self.aclose()
            raise StopAsyncIteration
        return item

    # -- reporting ---------------------------------------------------------------------------
    def _count(self, frames: int, seconds: float) -> None:
        self._frames += frames
        self._batches += 1
        self._collect_time += seconds
        self._batch_done()

    def stats(self) -> CollectorStats:
        """Return a `CollectorStats` snapshot (frames, batches, frames/s, policy version)."""
        total = self._total_frames
        return CollectorStats(
            frames=self._frames,
            batches=self._batches,
            total_frames=None if math.isinf(total) else int(total),
            frames_per_second=self._frames / self._collect_time if self._collect_time else 0.0,
            policy_version=self._policy_version(),
            completed=self._exhausted(),
            **self._env_counts(),
        )

    def _env_counts(self) -> dict[str, Any]:
        """Env steps recorded as truncations instead of raised; collectors that own an env say."""
        return {}

    def __len__(self) -> int:
        total = self._total_frames
        if math.isinf(total):
            raise TypeError("len() is undefined for an endless collector (total_frames=-1)")
        return math.ceil(total / self._frames_per_batch)

    def _activity(self) -> int:
        """A count that grows while the collector works: env steps where it can tell, else batches.

        Read from other threads (a collection node's heartbeat), so it only reads attributes.
        """
        return self._batches

    def _repr_extra(self) -> str:
        return f"pid {os.getpid()}"

    def __repr__(self) -> str:
        total = self._total_frames
        budget = "endless" if math.isinf(total) else int(total)
        state = "closed" if self._closed else "open" if self._started else "not started"
        return (
            f"<{type(self).__name__} [{state} | frames: {self._frames}/{budget} | batches: {self._batches} "
            f"| policy v{self._policy_version()} | {self._repr_extra()}]>"
        )

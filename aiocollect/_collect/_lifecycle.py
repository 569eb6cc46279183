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
import torch
from anyio.abc import TaskGroup
from tensordict import TensorDictBase

from .._buffer._torchrl import TorchRLBufferSink
from .._core._errors import CollectorClosedError, note_once
from .._core._ragged import dense_parts
from .._core._stats import CollectorStats
from ._api import CollectorAPI
from ._background import BackgroundMixin
from ._pipeline import BatchPipeline
from ._trajs import TrajectoryAssembler, check_traj_args

__all__ = ["CollectorLifecycle"]


_NOTHING = object()  # the frame budget ran out before a whole batch of trajectories
_WORKER_ID = ("collector", "worker_id")


class _WorkerTrajectories(TrajectoryAssembler):
    """A `TrajectoryAssembler` that keeps each worker's unfinished episodes apart.

    An env row's episode goes on in the same row of the next batch from the same workers, but
    a `MultiAsyncCollector` delivers one worker's batch at a time: row 0 of two batches may be
    two workers' envs. So unfinished episodes are kept per set of ``("collector", "worker_id")``
    the batch comes from (one worker, a node's workers, or all of them, stacked in the same
    order every time), then per row. Finished episodes share one queue, in completion order.
    """

    def __init__(
        self, trajs_per_batch: int, traj_format: str | None, trajs_per_write: int | None, *, drop_open: bool = False
    ) -> None:
        super().__init__(trajs_per_batch, traj_format, trajs_per_write, drop_open=drop_open)
        self._by_source: dict[tuple[int, ...], dict[int, Any]] = {(): self._partial}

    def add(self, batch: TensorDictBase) -> None:
        """Cut a ``[*B, T]`` batch into episodes, continuing its workers' unfinished ones."""
        parts = dense_parts(batch)  # a ragged batch's ids have no common shape: read part by part
        ids = [part.get(_WORKER_ID, None) for part in parts]
        source = () if ids[0] is None else tuple(torch.unique(torch.cat([i.flatten() for i in ids])).tolist())
        # The base class keeps unfinished episodes in self._partial, by env row: it gets the
        # rows of this batch's workers.
        self._partial = self._by_source.setdefault(source, {})
        super().add(batch)

    def reset(self) -> None:
        """Drop every worker's unfinished episodes and the queued trajectories."""
        super().reset()
        for partial in self._by_source.values():
            partial.clear()


class _Failure:
    """An exception travelling from the producer task to the consumer through the stream."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class CollectorLifecycle(CollectorAPI, BackgroundMixin, BatchPipeline):
    """Base of the async collectors (not public): lifecycle, iteration and statistics."""

    _total_frames: float
    _max_queued_batches: int
    _frames_per_batch: int
    _inplace_watch: Any = None  # an InPlaceWatch while workers may hold weights the trainer has changed

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
        split_trajs: bool = False,
        reset_at_each_iter: bool = False,
    ) -> None:
        self._init_background(replay_buffer)
        self._user_rb = replay_buffer
        rb = self._rb
        ndim = rb.storage.ndim if rb is not None else None
        check_traj_args(trajs_per_batch, traj_format, trajs_per_write, ndim, split_trajs=split_trajs)
        if not isinstance(extend_buffer, bool):
            raise TypeError(f"extend_buffer must be a bool, got {extend_buffer!r}")
        if not extend_buffer and rb is not None and (postprocessing or trajs_per_batch is not None):
            raise ValueError(
                "extend_buffer=False writes frames into the buffer step by step, without postproc, split_trajs "
                "or trajs_per_batch; drop those or keep extend_buffer=True"
            )
        # A TorchRL buffer is written as TorchRL's collectors write it (see _deliver_parts),
        # which regroups finished trajectories itself: the assembler hands them over one by one.
        self._torchrl_rb = rb if isinstance(rb, TorchRLBufferSink) else None
        self._extend_buffer = extend_buffer
        self._traj_options = (trajs_per_batch, traj_format, trajs_per_write)  # as given (TorchRL's attributes)
        per_write = 1 if self._torchrl_rb is not None else trajs_per_write
        self._traj = (
            None
            if trajs_per_batch is None
            else _WorkerTrajectories(trajs_per_batch, traj_format, per_write, drop_open=reset_at_each_iter)
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
            try:
                await self.aclose()
            except Exception as close_error:  # an env that failed to close, say
                if exc is None:
                    raise
                # The body's exception (a cancellation included) goes on, and says what else failed.
                note_once(exc, f"closing the collector also failed: {type(close_error).__name__}: {close_error}")
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
        try:
            with anyio.CancelScope(shield=True):
                await self._close_resources()
        except BaseException:
            # The bounded teardown failed part way (a bug in a worker's stop, or an env's
            # close() that raised): free synchronously whatever it did not get to, for every
            # collector and transport at once. `_close_now` is idempotent.
            self._close_now()
            raise
        finally:
            if self._profiler is not None:  # an in-process profiler still recording writes what it has
                self._profiler.stop()
        watch, self._inplace_watch = self._inplace_watch, None
        if watch is not None and self._failure is None:
            watch.report()  # last: a warning turned into an error must not cut the teardown short

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
        if self._inplace_watch is not None:
            await self._inplace_watch.before_batch()
        if not self._raw_mode:
            return await self._collect_one()
        rb = self._rb
        while not self._exhausted():
            raw = await self._collect_one()
            if raw is None:  # paused before anything was collected, or written to a TorchRL buffer
                return None
            if self._traj is None:  # extend_buffer=False: each time step's frames are one write
                for part in dense_parts(raw):  # a ragged batch has no common last dim: part by part
                    for t in range(part.shape[-1]):
                        await rb.extend(part[..., t])
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
        self._iteration_started = True
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

    async def rollout(self) -> Any:
        """Collect one batch now and return it (``None`` if it went to the replay buffer).

        It counts as a batch of iteration (frames, ``postproc``, hooks) but ignores the frame
        budget, as TorchRL's ``rollout()`` does; with ``trajs_per_batch`` it returns the next
        batch of trajectories (``None`` if the budget ends first). Not inside ``async with``,
        whose task collects: call `next` there.

        Raises:
            RuntimeError: The collector is open with ``async with`` or collecting in the background.
        """
        if self._tg is not None:
            raise RuntimeError(
                f"rollout() collects outside iteration, but this {type(self).__name__} is open with 'async with', "
                "whose task collects; call next() instead"
            )
        self._check_not_background()
        self._iteration_started = True
        item = await self._next_item()
        return None if item is _NOTHING else item

    def start(self) -> None:
        super().start()
        self._iteration_started = True  # enable_profile() comes too late from now on

    start.__doc__ = BackgroundMixin.start.__doc__  # its documentation, not a second copy

    # -- reporting ---------------------------------------------------------------------------
    def _count(self, frames: int, seconds: float) -> None:
        self._frames += frames
        self._batches += 1
        self._collect_time += seconds
        self._batch_done()

    def stats(self) -> CollectorStats:
        """Return a `CollectorStats` snapshot: frames, batches, budget, policy version, frames/s.

        Cheap, safe to call at any time, and JSON-serialisable (TorchRL's ``stats()`` keys).
        """
        return CollectorStats(self._stats_fields())

    def _stats_fields(self) -> dict[str, Any]:
        total = self._total_frames
        return {
            "frames": self._frames,
            "batches": self._batches,
            "total_frames": None if math.isinf(total) else int(total),
            "completed": self._exhausted(),
            "requested_frames_per_batch": self.requested_frames_per_batch,
            "policy_version": self._policy_version(),
            "frames_per_second": self._frames / self._collect_time if self._collect_time else 0.0,
            **self._env_counts(),
        }

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

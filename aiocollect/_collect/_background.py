"""Background collection into a replay buffer: ``start()``, ``pause()``, ``async_shutdown()``.

The background loop is a task in the collector's own task group (so leaving ``async with``
stops it), calling the same ``_collect_one`` that ``async for`` uses. Each call writes one
batch into the buffer. Its failure is recorded in the buffer, whose next ``sample()`` or
``extend()`` raises it; if nobody sampled, ``async_shutdown()`` (or leaving ``async with``)
raises it instead. Nothing is swallowed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

__all__ = ["BackgroundMixin", "unwrap_buffer"]


def unwrap_buffer(replay_buffer: Any) -> Any:
    """The async `ReplayBuffer` behind ``replay_buffer`` (its blocking twin), or a TorchRL buffer's sink."""
    from .._buffer._buffer import ReplayBuffer
    from .._buffer._torchrl import TorchRLBufferSink, is_torchrl_buffer

    if replay_buffer is None:
        return None
    if is_torchrl_buffer(replay_buffer):
        return TorchRLBufferSink(replay_buffer)
    inner = getattr(replay_buffer, "_async", replay_buffer)
    if not isinstance(inner, ReplayBuffer):
        raise TypeError(
            "replay_buffer must be an aiocollect.ReplayBuffer (or its blocking twin) or a torchrl.data.ReplayBuffer, "
            f"got {type(replay_buffer).__name__}"
        )
    return inner


class BackgroundMixin:
    """Mixed into `CollectorLifecycle`; see the module docstring."""

    _rb: Any
    _tg: Any
    _closed: bool

    def _init_background(self, replay_buffer: Any) -> None:
        self._rb = unwrap_buffer(replay_buffer)
        self._bg_scope: anyio.CancelScope | None = None
        self._bg_running = False
        # True while a batch holds buffer rows: pause() waits for it. A batch still waiting
        # for the rate limiter holds nothing, and gives up its rows if paused meanwhile.
        self._bg_holding = False
        self._bg_error: BaseException | None = None
        self._paused = False
        # Created by start(): anyio events need the running event loop.
        self._resumed: Any = None
        self._progress: Any = None
        self._finished: Any = None

    # hooks ----------------------------------------------------------------------------------
    def _in_flight(self) -> int:
        """Batches being collected whose write has not been committed yet."""
        return int(self._bg_holding)

    async def _resume_dispatch(self) -> None:
        """Restart work that was held back while paused (multi-process collectors)."""

    def _exhausted(self) -> bool:
        raise NotImplementedError

    async def _collect_one(self) -> Any:
        raise NotImplementedError

    def _batch_done(self) -> None:
        # Wakes a pause() waiting for in-flight batches to land.
        if self._progress is not None:
            self._progress.set()
            self._progress = anyio.Event()

    # public API -----------------------------------------------------------------------------
    def start(self) -> None:
        """Collect into the replay buffer in the background until the frame budget is spent.

        Call it inside ``async with collector:``; the background task belongs to the
        collector and stops when the block is left (or at `async_shutdown`). Iterating the
        collector while it runs in the background is an error.

        Raises:
            RuntimeError: No ``replay_buffer=`` was given, the collector is not open, or it
                is already running.
        """
        name = type(self).__name__
        if self._rb is None:
            raise RuntimeError(f"start() needs a replay buffer to write into; create the {name} with replay_buffer=...")
        if self._tg is None or self._closed:
            raise RuntimeError(f"start() needs an open {name}; call it inside 'async with collector:'")
        if self._bg_running or self._bg_scope is not None:
            raise RuntimeError(f"this {name} was already started; start() it only once")
        self._bg_scope = anyio.CancelScope()
        self._resumed, self._progress, self._finished = anyio.Event(), anyio.Event(), anyio.Event()
        self._bg_running = True
        self._tg.start_soon(self._background)

    def is_running(self) -> bool:
        """Whether the background collection started by `start` is still going."""
        return self._bg_running

    async def wait_finished(self) -> None:
        """Wait until the background collection started by `start` has ended.

        It ends when the frame budget is spent, when it fails, or at shutdown. Its error, if
        any, is not raised here: ``sample()`` or `async_shutdown` raises it.

        Raises:
            RuntimeError: `start` was not called.
        """
        if self._finished is None:
            name = type(self).__name__
            raise RuntimeError(f"wait_finished() waits for background collection; call {name}.start() first")
        await self._finished.wait()

    async def _background(self) -> None:
        assert self._bg_scope is not None
        try:
            with self._bg_scope:
                # Shutdown may start while this task is runnable but not yet resumed (a thread
                # call it awaited has just returned): then the cancellation lands only at the
                # next checkpoint, after this check, so a closed collector must end the loop here.
                while not self._exhausted() and not self._stopping():
                    if self._paused and self._in_flight() == 0:
                        await self._resumed.wait()
                        continue
                    await self._next_item()  # type: ignore[attr-defined]
        except Exception as exc:
            self._bg_error = exc
            self._rb.fail(exc)
        finally:
            self._bg_running = False
            if self._exhausted():
                self._writer_done()  # type: ignore[attr-defined]
            self._batch_done()
            self._finished.set()

    @asynccontextmanager
    async def pause(self) -> AsyncIterator[None]:
        """Stop writing into the buffer for the duration of the ``async with`` block.

        Entering waits until batches already being collected have been written; nothing is
        written inside the block. Collection resumes on exit.

        Raises:
            RuntimeError: The collector is not running in the background.
        """
        if not self._bg_running:
            name = type(self).__name__
            raise RuntimeError(f"pause() only applies to a {name} running in the background; call start() first")
        if self._paused:
            raise RuntimeError("this collector is already paused; pause() blocks do not nest")
        self._paused = True
        try:
            while self._in_flight() and self._bg_running:
                await self._progress.wait()
            yield
        finally:
            self._paused = False
            self._resumed.set()
            self._resumed = anyio.Event()
            if not self._closed:
                await self._resume_dispatch()

    def _stopping(self) -> bool:
        """Whether shutdown has begun: no new batch may start."""
        return self._closed or (self._bg_scope is not None and self._bg_scope.cancel_called)

    def _check_not_background(self) -> None:
        if self._bg_scope is not None:
            raise RuntimeError(
                f"this {type(self).__name__} collects in the background (start()); sample its replay buffer "
                "instead of iterating"
            )

    def _stop_background(self) -> None:
        if self._bg_scope is not None:
            self._bg_scope.cancel()

    def _undelivered_error(self) -> BaseException | None:
        err = self._bg_error
        if err is None or (self._rb is not None and getattr(self._rb, "_error_delivered", False)):
            return None
        return err

    async def async_shutdown(self) -> None:
        """Stop background collection and shut down (`aclose`), within the shutdown deadline.

        Raises:
            Exception: The background collection's error, if no ``sample()`` raised it yet.
        """
        await self.aclose()  # type: ignore[attr-defined]
        err = self._undelivered_error()
        if err is not None:
            self._bg_error = None
            raise err

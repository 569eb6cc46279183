"""The message pump: reads worker messages for whoever is waiting, one reader at a time.

Every wait in a multi-process collector (a batch from each worker, the first batch from any
worker, weight acknowledgements) is ``await pump.until(predicate)``. One waiter at a time
reads sockets (racing all live workers by fd readiness) and records what arrived; the others
sleep on an event that fires after each message. No message is read twice or dropped, and a
cancelled waiter never consumes a message it does not record.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from ._errors import first_failure
from ._workers._base import WorkerHandle

__all__ = ["Pump"]


class Pump:
    """Dispatches worker messages into per-worker state the collectors read."""

    def __init__(
        self,
        workers: Sequence[WorkerHandle],
        on_exit: Callable[[int, int | None], Awaitable[None]],
        watchdog: Callable[[], float | None] | None = None,
    ) -> None:
        self.workers = list(workers)
        self.pending: list[deque[int]] = [deque() for _ in workers]  # slots with a fresh batch
        self.acked: list[int] = [-1] * len(workers)  # last weights version each worker applied
        self.alive: list[bool] = [True] * len(workers)
        self.failures: list[BaseException] = []
        # A weak reference: the collector owns the pump, and a strong bound method back to it
        # would make a reference cycle that delays (and disorders) finalization of an
        # unclosed collector until the cyclic garbage collector runs.
        self._on_exit = weakref.WeakMethod(on_exit)  # type: ignore[arg-type]
        # Checks busy workers for progress (recording failures for stalled ones) and says
        # when to check again; reads stop waiting then, so a silent worker is noticed.
        self._watchdog = None if watchdog is None else weakref.WeakMethod(watchdog)  # type: ignore[arg-type]
        self._lock = anyio.Lock()
        self._changed = anyio.Event()

    def _dispatch(self, w: int, msg: tuple[Any, ...]) -> tuple[int, int | None] | None:
        kind = msg[0]
        if kind == "batch":
            self.pending[w].append(msg[1])
        elif kind == "ack":
            self.acked[w] = max(self.acked[w], msg[1])
        elif kind == "error":
            from ._errors import worker_error_from_message

            self.alive[w] = False
            self.failures.append(worker_error_from_message(w, self.workers[w].pid, msg))
        elif kind == "exited":
            self.alive[w] = False
            return (w, msg[1])
        else:
            self.failures.append(RuntimeError(f"worker {w} sent an unexpected message {kind!r}"))
        return None

    async def _read_some(self, timeout: float | None) -> list[tuple[int, tuple[Any, ...]]]:
        live = [w for w, ok in enumerate(self.alive) if ok]
        got: list[tuple[int, tuple[Any, ...]]] = []
        for w in live:  # fast path: whatever is already readable, without spawning tasks
            msg = self.workers[w].receive_nowait()
            if msg is not None:
                got.append((w, msg))
        if got or not live:
            return got

        async def one(w: int, scope: anyio.CancelScope) -> None:
            got.append((w, await self.workers[w].receive()))
            scope.cancel()

        with anyio.move_on_after(timeout):
            async with anyio.create_task_group() as tg:
                for w in live:
                    tg.start_soon(one, w, tg.cancel_scope)
        return got

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Read messages until ``predicate()`` holds; raise the first worker failure seen."""
        while True:
            watchdog = self._watchdog() if self._watchdog is not None else None
            next_check = watchdog() if watchdog is not None else None
            if self.failures:
                failures, self.failures = self.failures, []
                raise first_failure(failures)
            if predicate():
                return
            if self._lock.locked():
                await self._changed.wait()
                continue
            async with self._lock:
                exits = []
                for w, msg in await self._read_some(next_check):
                    ended = self._dispatch(w, msg)
                    if ended is not None:
                        exits.append(ended)
                on_exit = self._on_exit()
                for w, code in exits:
                    if on_exit is not None:
                        await on_exit(w, code)  # restarts the worker, or records a failure
                if not any(self.alive) and not self.failures and not predicate():
                    self.failures.append(RuntimeError("every worker has stopped"))
                self._changed.set()
                self._changed = anyio.Event()

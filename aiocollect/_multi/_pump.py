"""The event pump: reads worker events for whoever is waiting, one reader at a time.

Every wait in a multi-worker collector (a batch from each worker, the first batch from any
worker, weight acknowledgements) is ``await pump.until(predicate)``. One waiter at a time
reads the transport (which races all live workers) and records what arrived; the others
sleep on an event that fires after each read. No event is read twice or dropped, and a
cancelled waiter never consumes an event it does not record (the transport keeps it).
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Awaitable, Callable

import anyio

from .._core._errors import first_failure
from .._workers._messages import BatchReady, Event, Exited, Failed, Reply, WeightsApplied
from .._workers._transport import Transport

__all__ = ["Pump"]


class Pump:
    """Dispatches worker messages into per-worker state the collectors read."""

    def __init__(
        self,
        transport: Transport,
        on_exit: Callable[[int, int | None], Awaitable[None]],
        watchdog: Callable[[], float | None] | None = None,
    ) -> None:
        self.transport = transport
        n = transport.num_workers
        self.pending: list[deque[int]] = [deque() for _ in range(n)]  # slots with a fresh batch
        self.payloads: list[dict[int, bytes]] = [{} for _ in range(n)]  # pickled batches (no fixed layout), by slot
        self.acked: list[int] = [-1] * n  # last weights version each worker applied
        self.replies: list[dict[int, Reply]] = [{} for _ in range(n)]  # answers to RemoteCall, by seq
        self.alive: list[bool] = [False] * n  # set once a worker is started
        self.failures: list[BaseException] = []
        # A weak reference: the collector owns the pump, and a strong bound method back to it
        # would make a reference cycle that delays (and disorders) finalization of an
        # unclosed collector until the cyclic garbage collector runs.
        self._on_exit = weakref.WeakMethod(on_exit)
        # Checks busy workers for progress (recording failures for stalled ones) and says
        # when to check again; reads stop waiting then, so a silent worker is noticed.
        self._watchdog = None if watchdog is None else weakref.WeakMethod(watchdog)
        self._lock = anyio.Lock()
        self._changed = anyio.Event()

    def _dispatch(self, w: int, event: Event) -> tuple[int, int | None] | None:
        if isinstance(event, BatchReady):
            if event.payload is not None:
                self.payloads[w][event.slot] = event.payload
            self.pending[w].append(event.slot)
        elif isinstance(event, WeightsApplied):
            self.acked[w] = max(self.acked[w], event.version)
        elif isinstance(event, Reply):
            self.replies[w][event.seq] = event
        elif isinstance(event, Failed):
            from .._core._errors import worker_error_from_message

            self.alive[w] = False
            self.failures.append(worker_error_from_message(w, self.transport.pid(w), event))
        elif isinstance(event, Exited):
            self.alive[w] = False
            return (w, event.exitcode)
        else:
            self.failures.append(RuntimeError(f"worker {w} sent an unexpected message {event!r}"))
        return None

    async def _read_some(self, timeout: float | None) -> list[tuple[int, Event]]:
        live = [w for w, ok in enumerate(self.alive) if ok]
        got = self.transport.receive_nowait(live)
        if got or not live:
            return got
        with anyio.move_on_after(timeout):
            got = await self.transport.receive(live)
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
                for w, event in await self._read_some(next_check):
                    if not self.alive[w]:
                        continue  # a failed worker's last words (its exit) change nothing
                    ended = self._dispatch(w, event)
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

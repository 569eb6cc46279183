"""A condition that async tasks on any event loop (and in any thread) can wait on.

The replay buffer is shared by a collector and a trainer that may not run on the same event
loop: a blocking ``SyncDataCollector`` runs in its portal's loop while a blocking buffer
twin samples through another. `Notifier` keeps a list of waiters, each with its own loop's
thread-safe scheduler, so a state change in one loop wakes tasks in every other. All state
the predicates read must be guarded by `Notifier.lock`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio

from ._loops import current_scheduler

__all__ = ["Notifier"]


class Notifier:
    """Wakes every waiter whenever `notify_all` is called, whatever loop or thread it runs in."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._waiters: list[tuple[Callable[[Callable[[], Any]], Any], anyio.Event]] = []

    async def wait_until(self, predicate: Callable[[], bool]) -> float:
        """Return once ``predicate()`` (evaluated under `lock`) is true; a checkpoint either way.

        Returns:
            Seconds spent waiting for the predicate: from the first time it was found false
            until it was found true, so 0.0 when it held at once. The checkpoint taken
            first is not counted: time other tasks run then is scheduling, not waiting.
        """
        # Always yield to the loop, even when no wait is needed: a trainer looping on
        # ``await buffer.sample()`` must not starve the collector feeding the buffer.
        await anyio.lowlevel.checkpoint()
        start: float | None = None
        while True:
            with self.lock:
                if predicate():
                    return 0.0 if start is None else time.perf_counter() - start
                if start is None:
                    start = time.perf_counter()
                scheduler = current_scheduler()
                assert scheduler is not None  # called from a coroutine, so a loop runs
                entry = (scheduler, anyio.Event())
                self._waiters.append(entry)
            try:
                await entry[1].wait()
            finally:
                with self.lock:
                    if entry in self._waiters:
                        self._waiters.remove(entry)

    def notify_all(self) -> None:
        """Wake every current waiter (they re-check their predicates)."""
        with self.lock:
            waiters, self._waiters = self._waiters, []
        for schedule, event in waiters:
            try:
                schedule(event.set)
            except RuntimeError:  # that loop has closed: nobody is waiting there any more
                pass

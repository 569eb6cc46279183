"""A condition that async tasks on any event loop (and in any thread) can wait on.

The replay buffer is shared by a collector and a trainer that may not run on the same event
loop: a blocking ``SyncDataCollector`` runs in its portal's loop while a blocking buffer
twin samples through another. `Notifier` keeps a list of waiters, each with its own loop's
thread-safe scheduler, so a state change in one loop wakes tasks in every other. All state
the predicates read must be guarded by `Notifier.lock`.

A waiter may name the one thing it waits for (a key: a node's index). A change that
concerns one key (`notify`) then wakes only that key's waiters and the waiters on any
change. The transports need this: while N nodes start (or stop), N tasks each wait for their
own node, and if every node's event woke every task, N nodes would cost N²/2 wake-ups (about
128,000 for 512 nodes, seconds of the trainer's CPU: ``benchmarks/bench_wakeups.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

import anyio

from ._loops import current_scheduler

__all__ = ["Notifier"]

_Waiter = tuple[Callable[[Callable[[], Any]], Any], anyio.Event]


class Notifier:
    """Wakes waiters whenever the state they wait on may have changed, whatever loop or thread it changes in.

    `notify_all` wakes every waiter; `notify` (``key``) wakes the waiters on ``key`` and
    those that wait on any change (no key).
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._waiters: dict[Hashable, list[_Waiter]] = {}  # key (None: any change) -> its waiters

    async def wait_until(self, predicate: Callable[[], bool], key: Hashable = None) -> float:
        """Return once ``predicate()`` (evaluated under `lock`) is true; a checkpoint either way.

        Args:
            predicate: what to wait for; it must read only state guarded by `lock`.
            key: what the predicate depends on, if one thing: then only `notify` for that key
                (or `notify_all`) re-checks it. None (the default): every notification does.

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
                self._waiters.setdefault(key, []).append(entry)
            try:
                await entry[1].wait()
            finally:
                with self.lock:
                    waiters = self._waiters.get(key)
                    if waiters is not None and entry in waiters:  # cancelled before it was woken
                        waiters.remove(entry)
                        if not waiters:
                            del self._waiters[key]

    def notify(self, key: Hashable) -> None:
        """Wake the waiters on ``key`` and those on any change (they re-check their predicates)."""
        with self.lock:
            woken = self._waiters.pop(key, None)
            anyone = self._waiters.pop(None, None) if key is not None else None
        if woken:
            _wake(woken)
        if anyone:
            _wake(anyone)

    def notify_all(self) -> None:
        """Wake every current waiter (they re-check their predicates)."""
        with self.lock:
            waiters, self._waiters = self._waiters, {}
        for woken in waiters.values():
            _wake(woken)


def _wake(waiters: list[_Waiter]) -> None:
    for schedule, event in waiters:
        try:
            schedule(event.set)
        except RuntimeError:  # that loop has closed: nobody is waiting there any more
            pass

"""Running blocking work off the event loop with a bounded, observable shutdown."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import torch

__all__ = ["ThreadLane", "adopt_torch_threads", "to_thread"]

T = TypeVar("T")


def adopt_torch_threads(n: int) -> None:
    """Give the current thread ``n`` torch intra-op threads.

    OpenMP's thread count is per thread: ``torch.set_num_threads(1)`` in the main thread
    does not reach a thread that ran no torch op before, and BLAS calls made there use every
    core, with the extra OpenMP threads spinning between calls (a whole core each).
    """
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def _adopting(n: int, fn: Callable[..., T], *args: Any) -> T:
    adopt_torch_threads(n)
    return fn(*args)


async def to_thread(fn: Callable[..., T], *args: Any, abandon_on_cancel: bool = False) -> T:
    """``anyio.to_thread.run_sync`` with the calling thread's torch thread count."""
    return await anyio.to_thread.run_sync(
        _adopting, torch.get_num_threads(), fn, *args, abandon_on_cancel=abandon_on_cancel
    )


class _StaleCall(Exception):
    """A call that was abandoned before it started; its result goes nowhere."""


class ThreadLane:
    """One lane of blocking work: at most one call runs at a time, and the lane knows when it is idle.

    A call is abandoned (not waited for) when its caller is cancelled, so cancellation takes
    effect at once; ``stop`` is set at the same time so cooperative code (the rollout checks it
    every step) finishes soon after. `wait_idle` then bounds how long teardown waits for it.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._busy = threading.Lock()  # held by the thread while a call runs
        self._generation = 0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        self._generation += 1
        generation = self._generation
        self.stop.clear()

        def call() -> T:
            with self._busy:
                # A call whose caller was cancelled before the thread picked it up must not run.
                if generation != self._generation or self.stop.is_set():
                    raise _StaleCall
                return fn(*args)

        try:
            return await to_thread(call, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            self.stop.set()
            raise

    @property
    def idle(self) -> bool:
        return not self._busy.locked()

    async def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no call is running; return False if ``timeout`` expired first."""

        def wait() -> bool:
            if self._busy.acquire(timeout=-1 if timeout is None else timeout):
                self._busy.release()
                return True
            return False

        return self.idle or await anyio.to_thread.run_sync(wait, abandon_on_cancel=True)

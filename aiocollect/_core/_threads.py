"""Running blocking work off the event loop with a bounded, observable shutdown."""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
import torch

from ._loops import current_scheduler

__all__ = ["ThreadLane", "adopt_torch_threads", "to_thread"]

T = TypeVar("T")

_EXIT_GRACE = 2.0  # seconds lanes left running get, at interpreter exit, to leave a call


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
    """One lane of blocking work on its own daemon thread: one call at a time, in order.

    Env steps and policy calls run here instead of in the event loop's worker threads. A
    call is abandoned (not waited for) when its caller is cancelled, so cancellation takes
    effect at once; `stop` is set at the same time so cooperative code (the rollout checks
    it every step) finishes soon after; teardown queues its work behind that call (`run_final`)
    under its own deadline.

    The thread is a daemon, unlike asyncio's worker threads, which the interpreter joins at
    exit: an env step that never returns must not keep the user's process alive. The
    caller's loop is woken through its thread-safe scheduler, so any asyncio or trio loop
    (or several, one after another) can use the lane.
    """

    def __init__(self, name: str = "aiocollect lane") -> None:
        _LANES.add(self)
        self.stop = threading.Event()
        self._exiting = False  # the interpreter is exiting: run nothing more
        self._name = name
        self._busy = threading.Lock()  # held by the thread while a call runs
        self._generation = 0
        self._jobs: queue.SimpleQueue[Callable[[], _Pending[Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._busy:
                pending = job()
                del job
            pending.finish()  # after the lock: a caller that resumes finds the lane idle
            # Drop the call's arguments and result (the last reference to an abandoned batch)
            # now: an idle lane then holds no tensor, so a lane woken after the interpreter
            # began to finalize frees none (freeing one re-takes the GIL inside torch's C++
            # code, and the forced thread exit there aborts the process).
            del pending

    def _submit(self, fn: Callable[..., T], args: tuple[Any, ...], *, check_stale: bool) -> _Pending[T]:
        pending: _Pending[T] = _Pending()
        if self._exiting:  # no new thread once the exit hook has ended this lane's
            pending.error = _StaleCall()
            pending.finish()
            return pending
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        generation, threads = self._generation, torch.get_num_threads()

        def job() -> _Pending[T]:
            try:
                # A call whose caller was cancelled before the thread picked it up must not run.
                if self._exiting or (check_stale and (generation != self._generation or self.stop.is_set())):
                    raise _StaleCall
                pending.value = _adopting(threads, fn, *args)
            except BaseException as exc:
                pending.error = exc
            return pending

        self._jobs.put(job)
        return pending

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the lane's thread and return its result."""
        self._generation += 1
        self.stop.clear()
        pending = self._submit(fn, args, check_stale=True)
        try:
            return await pending.result()
        except anyio.get_cancelled_exc_class():
            self.stop.set()
            raise

    async def run_final(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` after whatever the lane is doing, even once `stop` is set (teardown)."""
        return await self._submit(fn, args, check_stale=False).result()

    @property
    def idle(self) -> bool:
        return not self._busy.locked()

    def wait_idle_blocking(self, timeout: float) -> bool:
        """Block the calling thread until no call runs, for at most ``timeout`` seconds."""
        if self._busy.acquire(timeout=timeout):
            self._busy.release()
            return True
        return False

    def close(self) -> None:
        """Let the thread exit after its current call (it is a daemon if that call never returns)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    async def aclose(self) -> None:
        """`close`, then wait for the thread to end (call it when the lane is idle)."""
        thread = self._thread
        if thread is None:
            return
        await self.run_final(lambda: None)  # the queue is empty now: only the exit remains
        self.close()
        thread.join(1.0)  # microseconds: the thread's last statement has already run


_LANES: weakref.WeakSet[ThreadLane] = weakref.WeakSet()


@atexit.register
def _stop_lanes_at_exit() -> None:
    # A lane left running (a collector nobody closed) should be out of torch's C++ code before
    # the interpreter finalizes: a daemon thread that re-enters Python then is ended by a
    # forced unwind, which aborts the process when it crosses C++ frames. Stopping makes the
    # rollout return at its next step, and the wait for that is bounded, so exit never hangs.
    # Idle lanes are closed and their threads joined, so that none wakes up during
    # finalization; a lane stuck in a call is left behind at the deadline.
    lanes = list(_LANES)
    threads = []
    for lane in lanes:
        lane._exiting = True
        lane.stop.set()
        threads.append(lane._thread)
        lane.close()
    deadline = time.monotonic() + _EXIT_GRACE
    for thread in threads:
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))


class _Pending(Generic[T]):
    """The result of one lane call, and a wake-up for the loop that awaits it."""

    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self._done = False  # set by the lane thread before it wakes the loop
        self._event = anyio.Event()
        self._schedule = current_scheduler()

    def finish(self) -> None:
        self._done = True
        if self._schedule is not None:
            try:
                self._schedule(self._event.set)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass

    async def result(self) -> T:
        if not self._done:
            await self._event.wait()
        if self.error is not None:
            error, self.error = self.error, None  # no reference cycle through the traceback
            raise error
        value, self.value = self.value, None  # the caller owns it now, the lane keeps none
        return value

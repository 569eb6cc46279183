"""The one blocking portal behind every blocking twin, and the in-loop misuse check.

Two things make a blocking twin safe to Ctrl-C, which anyio's portal alone does not:

* While the main thread waits on the portal, SIGINT only sets a flag and wakes the wait
  through a pipe. ``KeyboardInterrupt`` is raised afterwards, at one known point, never
  inside ``threading``/``concurrent.futures`` internals (where it can leave a lock held and
  the next wait hung forever) and never lost.
* Stopping the portal joins the worker threads its loop started, so the interpreter never
  exits while one of them is still freeing tensors: a daemon thread inside a C++ destructor
  at interpreter exit aborts the process ("terminate called without an active exception").

And a call costs one thread round trip, not anyio's two: the caller does not wait for the
loop to spawn its task (`_Launcher`). Distributed nodes use this portal too.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from contextvars import Context, copy_context
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

import anyio
import torch
from anyio.from_thread import BlockingPortal

from ._loops import current_scheduler, in_event_loop
from ._threads import adopt_torch_threads

__all__ = ["Portal"]

T = TypeVar("T")

# How long stopping the portal waits for its loop's worker threads to return. A worker that
# is still busy after this is stuck in user code the collector already gave up on.
_WORKER_JOIN_TIMEOUT = 5.0
# At interpreter exit, how long portals left running get to wind down (see _stop_at_exit).
EXIT_GRACE = 2.0


async def _adopting(n: int, fn: Callable[..., Any], *args: Any) -> Any:
    # The portal's loop thread does torch work (and hands it to worker threads, which take
    # its thread count), so it follows the caller's torch.set_num_threads.
    adopt_torch_threads(n)
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


class _Wakeup:
    """A pipe that wakes a waiting main thread from a signal handler or another thread."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)

    def poke(self, *_: object) -> None:
        try:
            os.write(self.w, b"\0")
        except (BlockingIOError, OSError):  # full (a wake-up is pending anyway) or closed
            pass

    def drain(self) -> bytes:
        data = b""
        try:
            while chunk := os.read(self.r, 512):
                data += chunk
        except (BlockingIOError, OSError):
            pass
        return data

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


class _SigintGuard:
    """Turns SIGINT into a flag for the duration of one portal call (main thread only).

    Only takes over when Python's default handler is installed: a handler the user set
    stays in charge.
    """

    def __init__(self, wakeup: _Wakeup | None) -> None:
        self._wakeup = wakeup
        self.interrupted = False
        self._previous: Any = None
        self._previous_fd: int | None = None
        self.active = (
            wakeup is not None
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # Runs between two bytecodes of the main thread, possibly inside a lock's critical
        # section, so it must not raise or take a lock: set a flag, write a byte.
        self.interrupted = True
        assert self._wakeup is not None
        self._wakeup.poke()

    def __enter__(self) -> _SigintGuard:
        if self.active:
            assert self._wakeup is not None
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            # The kernel may deliver SIGINT to any thread; then only the wake-up fd (written
            # by the C-level handler, whichever thread runs it) wakes the main thread.
            self._previous_fd = signal.set_wakeup_fd(self._wakeup.w, warn_on_full_buffer=False)
            if self._previous_fd != -1:  # someone else's; give it back, rely on the poke
                signal.set_wakeup_fd(self._previous_fd)
                self._previous_fd = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            if self._previous_fd is not None:
                signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGINT, self._previous)

    def wait(self, future: Future[Any], *, interruptible: bool = True) -> None:
        """Wait for ``future``; return early on SIGINT when ``interruptible``."""
        if not self.active:
            future.exception()  # waits; a non-main thread never receives KeyboardInterrupt
            return
        assert self._wakeup is not None
        future.add_done_callback(self._wakeup.poke)
        while not future.done() and not (interruptible and self.interrupted):
            select.select([self._wakeup.r], [], [])
            if bytes([signal.SIGINT]) in self._wakeup.drain():
                self.interrupted = True  # the Python-level handler may not have run yet


class Portal:
    """A lazily started anyio `BlockingPortal` running in its own thread.

    Every blocking method of a twin is one `call`; a call made from inside a running event
    loop raises instead of deadlocking that loop.
    """

    def __init__(self, blocking_name: str, async_name: str) -> None:
        self._names = (blocking_name, async_name)
        self._thread: threading.Thread | None = None
        self._portal: BlockingPortal | None = None
        self._launcher: _Launcher | None = None
        self._wakeup: _Wakeup | None = None
        self._cancel: Callable[[], None] | None = None  # stops the loop without waiting
        self._lock = threading.Lock()
        self._final = False  # stopped for good: no lazy restart

    def _check(self) -> None:
        if in_event_loop():
            blocking, async_ = self._names
            raise RuntimeError(
                f"{blocking} cannot be used inside a running event loop; use {async_} with 'async with' instead"
            )

    def _get(self) -> _Launcher:
        self._check()
        with self._lock:
            if self._launcher is None:
                if self._final:
                    raise RuntimeError(f"the {self._names[0]} portal has stopped for good")
                self._wakeup = _Wakeup()
                started = _start_portal_thread(f"{self._names[0]} portal")
                self._portal, self._launcher, self._thread, self._cancel = started
                _RUNNING.add(self)
            return self._launcher

    def call(self, fn: Callable[..., Any], *args: Any, interruptible: bool = True) -> Any:
        """Run ``fn(*args)`` (awaited if it is a coroutine function) in the portal's loop.

        Ctrl-C while waiting cancels the task in the portal and raises ``KeyboardInterrupt``
        here. With ``interruptible=False`` (teardown, which is bounded) the call runs to
        completion first and the interrupt is raised after it.
        """
        launcher = self._get()
        with _SigintGuard(self._wakeup) as guard:
            future = launcher.start(fn, *args)
            try:
                guard.wait(future, interruptible=interruptible)
            except BaseException:
                future.cancel()
                raise
            if guard.interrupted:
                future.cancel()
                raise KeyboardInterrupt
        return future.result()

    def wrap_async_context_manager(self, cm: Any) -> AbstractContextManager[Any]:
        """Wrap an async context manager, entered and exited in one task of the portal's loop."""
        return _BlockingContext(self, cm)

    @property
    def running(self) -> bool:
        return self._portal is not None

    def stop(self, *, final: bool = False) -> None:
        """Stop the portal's loop, join its thread and its worker threads. Idempotent.

        The next call starts a new loop, unless ``final``: then it raises `RuntimeError`.
        A Ctrl-C meanwhile is raised once everything has stopped.
        """
        if final:
            with self._lock:
                self._final = True
        if self._portal is None:
            return
        self._check()
        with self._lock:
            portal, thread, wakeup = self._portal, self._thread, self._wakeup
            self._portal = self._launcher = self._thread = self._wakeup = self._cancel = None
        if portal is None or thread is None or wakeup is None:
            return
        try:
            with _SigintGuard(wakeup) as guard:
                guard.wait(portal.start_task_soon(portal.stop), interruptible=False)
                thread.join()
        finally:
            wakeup.close()
        if guard.interrupted:
            raise KeyboardInterrupt

    def stop_nowait(self) -> None:
        """Tell the portal's loop to cancel everything and end, without waiting (finalizers).

        Whatever runs in the loop is cancelled; an open ``with`` block's teardown then runs
        in the portal's own thread. Nothing here waits on that thread or takes its lock, so
        it is safe from ``__del__``, at interpreter exit and from any thread.
        """
        portal, cancel, wakeup = self._portal, self._cancel, self._wakeup
        self._portal = self._launcher = self._thread = self._cancel = self._wakeup = None
        if portal is None or cancel is None:
            return
        cancel()
        if wakeup is not None:
            wakeup.close()


_RUNNING: weakref.WeakSet[Portal] = weakref.WeakSet()


@atexit.register
def _stop_at_exit() -> None:
    # A portal nobody stopped (a collector left running in the background, say) is cancelled
    # here, before the interpreter finalizes: its teardown then runs while Python still can.
    # A daemon thread still inside torch's C++ code when finalization starts is ended by a
    # forced unwind, which aborts the whole process ("terminate called without an active
    # exception"). The wait is bounded by EXIT_GRACE, so exit can never hang on it.
    deadline = time.monotonic() + EXIT_GRACE
    threads = []
    for portal in list(_RUNNING):
        threads.append(portal._thread)
        portal.stop_nowait()
    for thread in threads:
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))


class _BlockingContext(AbstractContextManager[Any]):
    """anyio's blocking async-context-manager wrapper, with the portal's Ctrl-C-safe waits."""

    def __init__(self, portal: Portal, cm: Any) -> None:
        self._portal = portal
        self._cm = cm
        self._exc_info: tuple[Any, Any, Any] = (None, None, None)
        self._exit_event: anyio.Event | None = None
        self._entered: Future[Any] = Future()
        self._done: Future[Any] | None = None

    async def _hold(self) -> Any:
        # __aenter__ and __aexit__ must run in one task: the collector's task group and
        # cancel scopes belong to it.
        self._exit_event = anyio.Event()
        try:
            value = await self._cm.__aenter__()
        except BaseException as exc:
            self._entered.set_exception(exc)
            raise
        self._entered.set_result(value)
        try:
            await self._exit_event.wait()
        finally:
            result = await self._cm.__aexit__(*self._exc_info)
        return result

    def __enter__(self) -> Any:
        launcher = self._portal._get()
        with _SigintGuard(self._portal._wakeup) as guard:
            self._done = launcher.start(self._hold)
            try:
                guard.wait(self._entered)
            except BaseException:
                self._done.cancel()
                raise
            if guard.interrupted:
                self._done.cancel()  # cancels __aenter__, or runs __aexit__ if it finished
                guard.wait(self._done, interruptible=False)
                raise KeyboardInterrupt
        return self._entered.result()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._done is not None and self._exit_event is not None
        self._exc_info = (exc_type, exc, tb)
        self._portal.call(self._exit_event.set, interruptible=False)
        with _SigintGuard(self._portal._wakeup) as guard:
            guard.wait(self._done, interruptible=False)  # teardown is bounded: let it finish
        already = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        if guard.interrupted and not already:
            raise KeyboardInterrupt
        return self._done.result()


class _Launcher:
    """Starts calls in the portal's loop from another thread, without waiting for them to start.

    anyio's ``BlockingPortal.start_task_soon`` blocks its caller until the loop has spawned
    the task: a thread round trip on top of the call's own. A thread that has been idle wakes
    slowly on a VM whose idle vCPUs halt (150-300 us measured for a round trip after 12 ms of
    other work), and a blocking twin's ``next()`` is one portal call per batch. Here the caller
    schedules the spawn and returns. The returned future follows ``start_task_soon``'s
    contract: cancelling it cancels the call, and a call the loop can no longer start (the
    portal is stopping) fails instead of waiting forever.
    """

    def __init__(self, schedule: Callable[[Callable[[], Any]], Any], group: Any, context: Context) -> None:
        # The spawn runs as a plain callback; in the loop's own context (taken in its main
        # task) anyio knows which event loop it is on, as it does in a task.
        self._schedule, self._group, self._context = schedule, group, context
        self._lock = threading.Lock()
        self._closed = False
        # Scheduled, not yet spawned: a loop that ends drops its pending callbacks, so
        # `close` fails these rather than leave their callers waiting.
        self._unstarted: set[Future[Any]] = set()

    def start(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Start ``fn(*args)`` (awaited if it returns an awaitable) in the loop; never waits."""
        future: Future[Any] = Future()
        spawn = partial(self._context.run, self._spawn, torch.get_num_threads(), fn, args, future)
        with self._lock:
            if self._closed:
                raise RuntimeError("the blocking portal has stopped")
            self._unstarted.add(future)
            self._schedule(spawn)
        return future

    def _spawn(self, threads: int, fn: Callable[..., Any], args: tuple[Any, ...], future: Future[Any]) -> None:
        with self._lock:
            self._unstarted.discard(future)
        try:
            self._group.start_soon(self._run, threads, fn, args, future)
        except RuntimeError:  # the task group has ended: the portal has stopped
            _fail(future)

    def close(self) -> None:
        """Start nothing more; fail the calls whose spawn never ran (the loop is ending)."""
        with self._lock:
            self._closed = True
            unstarted, self._unstarted = self._unstarted, set()
        for future in unstarted:
            _fail(future)

    async def _run(self, threads: int, fn: Callable[..., Any], args: tuple[Any, ...], future: Future[Any]) -> None:
        scope = anyio.CancelScope()
        schedule = self._schedule

        def on_done(f: Future[Any]) -> None:
            if f.cancelled():  # the caller gave up (Ctrl-C): cancel the call
                try:
                    schedule(scope.cancel)
                except RuntimeError:  # the loop has closed: so has the call
                    pass

        # The future stays pending until the call ends, so that the caller can cancel it
        # meanwhile (as anyio's portal does).
        try:
            with scope:
                future.add_done_callback(on_done)
                value = await _adopting(threads, fn, *args)
        except anyio.get_cancelled_exc_class():  # the whole loop is being cancelled
            future.cancel()
            raise
        except BaseException as exc:
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            if scope.cancelled_caught:  # cancelled through the future: nobody wants the result
                return
            if future.set_running_or_notify_cancel():
                future.set_result(value)


def _fail(future: Future[Any]) -> None:
    if not future.done() and future.set_running_or_notify_cancel():
        future.set_exception(RuntimeError("the blocking portal has stopped"))


def _start_portal_thread(name: str) -> tuple[BlockingPortal, _Launcher, threading.Thread, Callable[[], None]]:
    # Unlike anyio.from_thread.start_blocking_portal (a ThreadPoolExecutor thread, which the
    # interpreter joins at exit), this thread is a daemon: a script that forgets shutdown()
    # still exits instead of hanging. Worker processes are daemonic too and die with it.
    ready: Future[tuple[BlockingPortal, _Launcher, Callable[[], None]]] = Future()
    workers: list[threading.Thread] = []

    async def main() -> None:
        with anyio.CancelScope() as scope:
            schedule = current_scheduler()
            assert schedule is not None

            def cancel() -> None:
                try:
                    schedule(scope.cancel)  # never waits: the loop picks it up when it can
                except RuntimeError:  # the loop has already closed
                    pass

            # Calls run in their own task group, which outlives the portal's: stopping the
            # portal lets the calls in progress finish (as the portal's own tasks do).
            launcher: _Launcher | None = None
            try:
                async with anyio.create_task_group() as calls:
                    launcher = _Launcher(schedule, calls, copy_context())
                    async with BlockingPortal() as portal:
                        ready.set_result((portal, launcher, cancel))
                        await portal.sleep_until_stopped()
            finally:
                if launcher is not None:
                    launcher.close()
        # anyio tells this loop's worker threads to exit when the loop ends, but does not
        # wait for them; they are the threads that carry this loop in their ``loop`` attribute.
        loop = asyncio.get_running_loop()
        workers.extend(t for t in threading.enumerate() if getattr(t, "loop", None) is loop)

    def run() -> None:
        if hasattr(signal, "pthread_sigmask"):
            # Keep SIGINT for the main thread; this loop's worker threads inherit the mask.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            anyio.run(main)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
        deadline = time.monotonic() + _WORKER_JOIN_TIMEOUT
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    portal, launcher, cancel = ready.result()
    return portal, launcher, thread, cancel

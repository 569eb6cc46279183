"""The one blocking portal behind every blocking twin, and the in-loop misuse check."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import anyio
import sniffio
from anyio.from_thread import BlockingPortal

__all__ = ["Portal"]

T = TypeVar("T")


def _in_event_loop() -> bool:
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return False
    return True


class Portal:
    """A lazily started anyio `BlockingPortal` running in its own thread.

    Every blocking method of a twin is one `call`; a call made from inside a running event
    loop raises instead of deadlocking that loop.
    """

    def __init__(self, blocking_name: str, async_name: str) -> None:
        self._names = (blocking_name, async_name)
        self._thread: threading.Thread | None = None
        self._portal: BlockingPortal | None = None
        self._lock = threading.Lock()

    def _check(self) -> None:
        if _in_event_loop():
            blocking, async_ = self._names
            raise RuntimeError(
                f"{blocking} cannot be used inside a running event loop; use {async_} with 'async with' instead"
            )

    def _get(self) -> BlockingPortal:
        self._check()
        with self._lock:
            if self._portal is None:
                self._portal, self._thread = _start_portal_thread(f"{self._names[0]} portal")
            return self._portal

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` (awaited if it is a coroutine function) in the portal's loop."""
        future = self._get().start_task_soon(fn, *args)
        try:
            return future.result()
        except BaseException:
            # Ctrl-C (or any interruption) while waiting cancels the task in the portal too.
            future.cancel()
            raise

    def wrap_async_context_manager(self, cm: Any) -> AbstractContextManager[Any]:
        """Wrap an async context manager so it is entered and exited in the portal's loop."""
        return self._get().wrap_async_context_manager(cm)

    @property
    def running(self) -> bool:
        return self._portal is not None

    def stop(self) -> None:
        """Stop the portal's loop and join its thread. Idempotent."""
        with self._lock:
            portal, thread, self._portal, self._thread = self._portal, self._thread, None, None
        if portal is not None and thread is not None:
            self._check()
            portal.call(portal.stop)
            thread.join()


def _start_portal_thread(name: str) -> tuple[BlockingPortal, threading.Thread]:
    # Unlike anyio.from_thread.start_blocking_portal (a ThreadPoolExecutor thread, which the
    # interpreter joins at exit), this thread is a daemon: a script that forgets shutdown()
    # still exits instead of hanging. Worker processes are daemonic too and die with it.
    ready: Future[BlockingPortal] = Future()

    async def main() -> None:
        async with BlockingPortal() as portal:
            ready.set_result(portal)
            await portal.sleep_until_stopped()

    def run() -> None:
        try:
            anyio.run(main)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the thread that waits
            if not ready.done():
                ready.set_exception(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return ready.result(), thread

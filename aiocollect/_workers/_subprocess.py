"""The subprocess worker backend: one spawned process per worker.

The parent talks to a worker through one Unix socket (a duplex ``multiprocessing`` pipe)
carrying small tuples, and waits for it by file-descriptor readiness on the event loop, never
by polling and never in a blocking ``recv`` on the loop thread. A worker that dies closes its
end of the socket, so death wakes the same wait; the exit code then comes from the process
sentinel. Tensors travel through shared memory blocks whose descriptors cross at spawn time
(``DupFd``) or over the socket (``SCM_RIGHTS``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import threading
from multiprocessing.reduction import DupFd, send_handle
from typing import Any

import anyio
import anyio.to_thread

from .._shm import SharedBlock
from ._base import WorkerHandle
from ._worker_main import worker_main

__all__ = ["SubprocessWorker", "backend_class"]


class _FdArg:
    """An fd to duplicate into a child *while it is being spawned* (no helper thread needed)."""

    def __init__(self, fd: Any) -> None:
        self.fd = fd

    def __reduce__(self) -> Any:
        return (_FdArg, (None if self.fd is None else DupFd(self.fd),))

    def detach(self) -> int | None:
        """In the child: the duplicated descriptor, now owned by the caller."""
        return self.fd if self.fd is None or isinstance(self.fd, int) else self.fd.detach()


def _check_not_bootstrapping() -> None:
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        raise RuntimeError(
            "a multi-process collector was created while a worker process was starting: the main module "
            "creates collectors at import time; guard that code with `if __name__ == \"__main__\":`"
        )


# What the forkserver imports once, so each worker it forks starts with torch, tensordict
# and the worker loop already loaded (tens of milliseconds instead of seconds per worker).
_FORKSERVER_PRELOAD = ["torch", "tensordict", "gymnasium", "aiocollect", "aiocollect._workers._worker_main"]


_START_LOCK = threading.Lock()


def _preload_forkserver(ctx: Any) -> None:
    # Only effective before the process's forkserver starts; it is shared by the process.
    from multiprocessing import forkserver

    if forkserver._forkserver._forkserver_pid is None:  # type: ignore[attr-defined]
        ctx.set_forkserver_preload(_FORKSERVER_PRELOAD)


class SubprocessWorker(WorkerHandle):
    """A worker in its own ``spawn``-ed process."""

    def __init__(self, worker_id: int, start_method: str = "spawn") -> None:
        self.worker_id = worker_id
        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            _preload_forkserver(self._ctx)
        self._process: Any = None
        self._conn: Any = None
        self._alive_w: Any = None
        self._exitcode: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _spawn(self, config_bytes: bytes, weights: SharedBlock | None) -> None:
        _check_not_bootstrapping()
        parent, child = self._ctx.Pipe(duplex=True)
        alive_r, alive_w = self._ctx.Pipe(duplex=False)
        weights_fd = _FdArg(None if weights is None else weights.fd)
        process = self._ctx.Process(
            target=worker_main,
            args=(child, alive_r, config_bytes, weights_fd, 0 if weights is None else weights.size),
            name=f"aiocollect-worker-{self.worker_id}",
            daemon=True,
        )
        # Starting a process makes multiprocessing fix the *global* start method (it records
        # it for the child), after which the user's own set_start_method() fails. A library
        # must not do that: undo it if it was unset before.
        try:
            with _START_LOCK:  # workers start from several threads at once
                default = getattr(multiprocessing.context, "_default_context", None)
                unset = getattr(default, "_actual_context", False) is None
                try:
                    process.start()
                finally:
                    if unset:
                        default._actual_context = None  # type: ignore[union-attr]
        finally:
            # The child has its own copies now; keeping ours would hide the child's death.
            child.close()
            alive_r.close()
        self._process, self._conn, self._alive_w = process, parent, alive_w

    async def start(self, config_bytes: bytes, weights: SharedBlock | None) -> None:
        await anyio.to_thread.run_sync(self._spawn, config_bytes, weights)

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            self._conn.send(message)
        except (OSError, EOFError, ValueError):
            pass  # the worker is gone; receive() reports how it ended

    def send_fd(self, fd: int) -> None:
        send_handle(self._conn, fd, self._process.pid)

    def receive_nowait(self) -> tuple[Any, ...] | None:
        conn = self._conn
        if conn is None or not conn.poll():
            return None
        try:
            return conn.recv()
        except (EOFError, OSError):
            return None  # the blocking receive() reaps the process and reports the exit

    async def receive(self) -> tuple[Any, ...]:
        conn = self._conn
        if conn is None:
            return ("exited", self._exitcode)
        while not conn.poll():
            await anyio.wait_readable(conn.fileno())
        try:
            return conn.recv()
        except (EOFError, OSError):
            # The socket closed: the worker exited. Reap it to learn how.
            await self._join(5.0)
            return ("exited", self._exitcode)

    async def _join(self, timeout: float) -> bool:
        process = self._process
        if process is None:
            return True
        if process.exitcode is None:
            with anyio.move_on_after(timeout):
                await anyio.wait_readable(process.sentinel)
                # The sentinel fires when the child's fds close, a moment before the kernel
                # makes it reapable: finish with a short blocking join off the loop thread.
                await anyio.to_thread.run_sync(process.join, 1.0, abandon_on_cancel=True)
        self._exitcode = process.exitcode
        return process.exitcode is not None

    async def stop(self, timeout: float) -> None:
        """Ask the worker to close, then terminate, then kill; reap it and close every fd."""
        if self._process is None:
            return
        self.send(("close",))
        if not await self._join(timeout):
            self._process.terminate()
            if not await self._join(1.0):
                self._process.kill()
                await self._join(5.0)
        self._release()

    def kill_now(self) -> None:
        """Synchronous last resort (garbage collection): kill and reap without waiting long."""
        process = self._process
        if process is None:
            return
        if process.exitcode is None:
            process.kill()
        process.join(1.0)
        self._exitcode = process.exitcode
        # The connections are not closed here: during garbage collection of a reference cycle
        # their own finalizers may already have closed the descriptors, and closing a number
        # twice could close an unrelated file that reused it. Dropping them lets each
        # Connection close its descriptor exactly once.
        self._process = self._conn = self._alive_w = None

    def _release(self) -> None:
        for conn in (self._conn, self._alive_w):
            if conn is not None:
                conn.close()
        if self._process is not None:
            self._process.join(1.0)  # never leave a zombie behind
            if self._process.exitcode is not None:
                self._process.close()
        self._process = self._conn = self._alive_w = None


backend_class = SubprocessWorker

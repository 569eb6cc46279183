"""The subprocess transport: one local process per worker, memfd shared memory, Unix sockets.

The parent talks to a worker through one Unix socket (a duplex ``multiprocessing`` pipe)
carrying the records of ``_messages``, and waits for it by file-descriptor readiness on the
event loop, never by polling and never in a blocking ``recv`` on the loop thread. A worker
that dies closes its end of the socket, so death wakes the same wait; the exit code then
comes from the process sentinel. Output slots, control words and weights are memfd blocks
(``_core._shm``) whose descriptors cross at spawn time (``DupFd``) or over the socket
(``SCM_RIGHTS``): nothing is named in ``/dev/shm``, and the kernel frees the memory when the
last process holding it is gone, even after SIGKILL.

On Linux the default start method is ``forkserver`` with the worker modules preloaded: the
first collector of a process pays for importing torch once, in the fork server, and every
worker after that is forked from it ready to run.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import os
from collections import deque
from collections.abc import Mapping
from multiprocessing.reduction import send_handle
from typing import Any

import anyio
import anyio.to_thread

from .._core._errors import WorkerCrashedError, worker_error_from_message
from ._launch_group import kill_group, sweep_group
from ._messages import AttachStorage, Close, Command, Event, Exited, Failed, Ready
from ._prestart import leaving_start_method, preload_forkserver, run_in_environ
from ._subprocess_main import CONTROL_BYTES, FdArg, SlotsGiven, SlotsWanted, subprocess_main
from ._transport import BUSY, CONTROL_WORDS, PREEMPT, PROGRESS, STOP, Tensors, Transport

__all__ = ["SubprocessTransport", "transport_class"]

START_METHODS = ("forkserver", "spawn")


def start_leaving_start_method(process: Any) -> None:
    """``process.start()``, leaving the global start method as it was (see `leaving_start_method`)."""
    with leaving_start_method():
        process.start()


def _default_start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _check_not_bootstrapping() -> None:
    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        raise RuntimeError(
            "a multi-process collector was created while a worker process was starting: the main module "
            'creates collectors at import time; guard that code with `if __name__ == "__main__":`'
        )


class _Proc:
    """The parent's view of one worker process."""

    def __init__(self) -> None:
        self.process: Any = None
        self.conn: Any = None
        self.alive_w: Any = None
        self.slots: list[dict[Any, Any]] = []
        self.control: Any = None  # numpy view of the control words
        self.exitcode: int | None = None


class SubprocessTransport(Transport):
    """Workers in local processes (``forkserver`` on Linux by default, or ``spawn``)."""

    memory = "host"
    can_kill = True
    versioned_weights = True  # a seqlocked WeightBlock

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(options) - {"start_method"}
        if unknown:
            raise TypeError(
                f"the subprocess backend takes no option {sorted(unknown)[0]!r}; its only option is start_method"
            )
        method = options.get("start_method")
        if method is None:
            method = _default_start_method()
        if method not in START_METHODS or method not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"start_method must be 'forkserver' or 'spawn' (fork is unsafe with threads), got {method!r}"
            )
        return {"start_method": method}

    @classmethod
    def forks_from_server(cls, options: Mapping[str, Any]) -> bool:
        return bool(options["start_method"] == "forkserver")

    def __init__(self, num_workers: int, options: dict[str, Any], weights_layout: Any) -> None:
        super().__init__(num_workers, options, weights_layout)
        self._ctx = multiprocessing.get_context(options["start_method"])
        if options["start_method"] == "forkserver":
            preload_forkserver(self._ctx)
        self._procs = [_Proc() for _ in range(num_workers)]
        self._early: deque[tuple[int, Event]] = deque()
        self._weights: Any = None
        if weights_layout is not None:
            from ._weights import WeightBlock

            self._weights = WeightBlock(weights_layout)  # filled by the first publish_weights

    # -- life --------------------------------------------------------------------------------
    def _spawn(self, w: int, spec: bytes) -> None:
        _check_not_bootstrapping()
        parent, child = self._ctx.Pipe(duplex=True)
        alive_r, alive_w = self._ctx.Pipe(duplex=False)
        weights = self._weights
        process = self._ctx.Process(
            target=run_in_environ,
            args=(dict(os.environ), subprocess_main, child, alive_r, spec,
                  FdArg(None if weights is None else weights.block.fd), self.weights_layout),
            name=f"aiocollect-worker-{w}",
            daemon=True,
        )  # fmt: skip
        try:
            start_leaving_start_method(process)
        finally:
            # The child has its own copies now; keeping ours would hide the child's death.
            child.close()
            alive_r.close()
        p = self._procs[w]
        p.process, p.conn, p.alive_w, p.exitcode = process, parent, alive_w, None

    async def start(self, w: int, spec: bytes) -> Any:
        await anyio.to_thread.run_sync(self._spawn, w, spec)
        p = self._procs[w]
        while True:
            msg = await self._receive_one(w)
            if isinstance(msg, SlotsWanted):
                self._give_slots(p, msg)
            elif isinstance(msg, Ready):
                return msg.layout
            elif isinstance(msg, Failed):
                raise worker_error_from_message(w, self.pid(w), msg)
            elif isinstance(msg, Exited):
                raise WorkerCrashedError(w, self.pid(w), msg.exitcode, during_startup=True)
            else:  # pragma: no cover - a protocol bug
                raise RuntimeError(f"worker {w} sent {msg!r} during start-up")

    def _give_slots(self, p: _Proc, msg: SlotsWanted) -> None:
        import torch

        from .._core._shm import SharedBlock, layout_nbytes

        size = layout_nbytes(msg.layout)
        block = SharedBlock(msg.count * size + CONTROL_BYTES)
        try:
            p.conn.send(SlotsGiven(size))
            assert block.fd is not None
            send_handle(p.conn, block.fd, p.process.pid)
        finally:
            block.close_fd()  # the mapping stays while views of it live
        p.slots = [block.views(msg.layout, i * size) for i in range(msg.count)]
        p.control = block.views([("control", (CONTROL_WORDS,), torch.int64)], msg.count * size)["control"].numpy()

    async def _join(self, p: _Proc, timeout: float) -> bool:
        process = p.process
        if process is None:
            return True
        if process.exitcode is None:
            with anyio.move_on_after(timeout):
                await anyio.wait_readable(process.sentinel)
                # The sentinel fires when the child's fds close, a moment before the kernel
                # makes it reapable: finish with a short blocking join off the loop thread.
                await anyio.to_thread.run_sync(process.join, 1.0, abandon_on_cancel=True)
        p.exitcode = process.exitcode
        return process.exitcode is not None

    async def stop(self, w: int, timeout: float) -> None:
        p = self._procs[w]
        if p.process is None:
            return
        self.send(w, Close())
        if not await self._join(p, timeout):
            p.process.terminate()
            if not await self._join(p, 1.0):
                kill_group(p.process.pid)
                await self._join(p, 5.0)
        self._keep_close_failure(w, p.process.pid, [*(e for v, e in self._early if v == w), *_left_in(p.conn)])
        for conn in (p.conn, p.alive_w):
            if conn is not None:
                conn.close()
        p.process.join(1.0)  # never leave a zombie behind
        if p.process.exitcode is not None:
            sweep_group(p.process.pid)  # what the env started and left running
            p.process.close()
        p.process = p.conn = p.alive_w = None
        # Dropping the views unmaps the block (each mapping holds a descriptor until then).
        p.slots, p.control = [], None
        self._early = deque(e for e in self._early if e[0] != w)  # no event outlives stop(w)

    def stop_nowait(self) -> None:
        for p in self._procs:
            if p.control is not None:
                p.control[STOP] = 1  # workers cut the batch in progress short and read Close next

    def close_now(self) -> None:
        for p in self._procs:
            process = p.process
            if process is not None:
                if process.exitcode is None:
                    kill_group(process.pid)
                process.join(1.0)
                p.exitcode = process.exitcode
                if p.exitcode is not None:
                    sweep_group(process.pid)
            # The connections are not closed here: during garbage collection of a reference
            # cycle their own finalizers may already have closed the descriptors, and closing
            # a number twice could close an unrelated file that reused it. Dropping them lets
            # each Connection close its descriptor exactly once.
            p.process = p.conn = p.alive_w = None
            p.slots, p.control = [], None
        self._early.clear()
        if self._weights is not None:
            self._weights.close()

    # -- commands and events -----------------------------------------------------------------
    def send(self, w: int, command: Command) -> None:
        p = self._procs[w]
        if p.conn is None:
            return
        try:
            p.conn.send(command)
        except (OSError, EOFError, ValueError):
            pass  # the worker is gone; receive() reports how it ended

    def _receive_nowait(self, w: int) -> Event | None:
        conn = self._procs[w].conn
        if conn is None or not conn.poll():
            return None
        try:
            return conn.recv()
        except (EOFError, OSError):
            return None  # the waiting receive() reaps the process and reports the exit

    def receive_nowait(self, workers: list[int]) -> list[tuple[int, Event]]:
        got: list[tuple[int, Event]] = []
        if self._early:  # read by a receive() that was cancelled before it returned them
            keep: deque[tuple[int, Event]] = deque()
            for w, early in self._early:
                (got if w in workers else keep).append((w, early))
            self._early = keep
        for w in workers:
            msg = self._receive_nowait(w)
            if msg is not None:
                got.append((w, msg))
        return got

    async def _receive_one(self, w: int) -> Any:
        p = self._procs[w]
        conn = p.conn
        if conn is None:
            return Exited(p.exitcode)
        while not conn.poll():
            await anyio.wait_readable(conn.fileno())
        try:
            return conn.recv()
        except (EOFError, OSError):
            # The socket closed: the worker exited. Reap it to learn how.
            await self._join(p, 5.0)
            return Exited(p.exitcode)

    async def receive(self, workers: list[int]) -> list[tuple[int, Event]]:
        got = self.receive_nowait(workers)  # fast path: whatever is readable, without tasks
        if got or not workers:
            return got

        async def one(w: int, scope: anyio.CancelScope) -> None:
            msg = await self._receive_one(w)
            self._early.append((w, msg))  # kept here, so a cancelled receive() loses nothing
            scope.cancel()

        async with anyio.create_task_group() as tg:
            for w in workers:
                tg.start_soon(one, w, tg.cancel_scope)
        return self.receive_nowait(workers)

    # -- data --------------------------------------------------------------------------------
    def batch(self, w: int, slot: int) -> Tensors:
        return self._procs[w].slots[slot]

    def publish_weights(self, state: Tensors, version: int) -> None:
        self._weights.copy_in(state, version)

    def attach_storage(self, w: int, storage: Any) -> None:
        info, fd = storage.share()
        self.send(w, AttachStorage((info, fd is not None)))
        p = self._procs[w]
        if fd is not None and p.conn is not None:
            try:  # the descriptor follows the command over the socket (SCM_RIGHTS)
                send_handle(p.conn, fd, p.process.pid)
            except (OSError, EOFError, ValueError):
                pass  # the worker is gone; receive() reports how it ended

    # -- control words -----------------------------------------------------------------------
    def preempt(self, w: int, seq: int) -> None:
        control = self._procs[w].control
        if control is not None:
            control[PREEMPT] = seq

    def progress(self, w: int) -> tuple[int, bool] | None:
        control = self._procs[w].control
        return None if control is None else (int(control[PROGRESS]), bool(control[BUSY]))

    def pid(self, w: int) -> int | None:
        process = self._procs[w].process
        return None if process is None else process.pid

    def kill(self, w: int) -> None:
        p = self._procs[w].process
        if p is not None and p.exitcode is None:
            # SIGKILL (which a stopped process also obeys), to its processes too: its exit then
            # arrives as Exited.
            kill_group(p.pid)


transport_class = SubprocessTransport


def _left_in(conn: Any) -> list[Event]:
    """What an ended worker sent that was not read yet (its socket keeps it after the exit)."""
    left: list[Event] = []
    try:
        while conn is not None and conn.poll():
            left.append(conn.recv())
    except (EOFError, OSError):
        pass
    return left

"""`ProcessShards`: a `SlotPool`'s shards in env-only worker processes, exchanging through shared memory.

Each worker holds its shard's envs and nothing else (no policy, no torch model: it starts
as fast as its envs build). The slot arrays live in one memfd block mapped by the parent and
every worker (`SharedBlock`: nothing named in ``/dev/shm``, freed by the kernel with the
last mapping). Per shard call the pipe carries the row ids one way and one byte back; the
observations and actions stay in the block. The collector's thread drives the workers itself
(`send`, `wait` for whichever answers first, `finish`); where the steps are tasks on the event
loop instead (a coroutine policy), a step's reply is awaited by fd readiness on the loop
(`step`). A worker whose env raises answers with the error and its traceback
(raised in the parent as a `WorkerError` naming the worker); one that dies closes its pipe,
which wakes the same wait (`WorkerCrashedError`).

Start-up: the parent starts every worker with its envs' factories (cloudpickled: they may be
lambdas); each builds its envs and sends their spaces; the parent checks them, allocates the
block and passes its descriptor (``SCM_RIGHTS``); each worker maps it and says it is ready.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import traceback
from collections.abc import Sequence
from multiprocessing.connection import wait as _wait_conns
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

import anyio
import numpy as np

from .._core._errors import WorkerCrashedError, WorkerError, worker_error_from_message
from .._core._shm import SharedBlock, layout_nbytes
from .._workers._launch_group import (
    hide_from_forked_children,
    kill_group,
    lead_new_group,
    may_start_processes,
    sweep_group,
)
from .._workers._messages import Failed
from .._workers._prestart import preload_forkserver, run_in_environ
from .._workers._subprocess import _check_not_bootstrapping, _default_start_method, start_leaving_start_method
from ._shard import EnvShard, build_env, group_views, is_coroutine_env, single_env, slot_layout
from ._slots import check_same_spaces, spec_from_spaces

__all__ = ["ProcessShards", "env_worker_main"]

_STEP, _RESET, _CLOSE, _OK, _FAILED = b"S", b"R", b"C", b"K", b"F"
START_TIMEOUT = 120.0  # seconds a worker may take to build its envs


class ProcessShards:
    """Shards in worker processes (see the module docstring).

    Args:
        fns, kwargs: Every env's factory and its keyword arguments.
        shards: Each shard's env ids (one worker per shard).
        start_method: ``"forkserver"`` (Linux default) or ``"spawn"``.
        affinity: One CPU list per worker, set before it builds its envs; ``None``: inherited.
    """

    def __init__(self, fns: Sequence[Any], kwargs: Sequence[dict[str, Any]], shards: list[np.ndarray],
                 start_method: str | None, affinity: Sequence[Sequence[int]] | None = None) -> None:  # fmt: skip
        import cloudpickle

        _check_not_bootstrapping()
        self.shards = shards
        method = start_method or _default_start_method()
        ctx: Any = multiprocessing.get_context(method)
        if method == "forkserver":
            preload_forkserver(ctx)
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        try:
            for s, rows in enumerate(shards):
                parent, child = ctx.Pipe(duplex=True)
                spec = cloudpickle.dumps({
                    "envs": [(int(i), fns[i], kwargs[i]) for i in rows],
                    "affinity": None if affinity is None else list(affinity[s]),
                })  # fmt: skip
                process = ctx.Process(target=run_in_environ, args=(dict(os.environ), env_worker_main, child, spec),
                                      name=f"aiocollect-env-worker-{s}", daemon=True)  # fmt: skip
                try:
                    start_leaving_start_method(process)
                finally:
                    child.close()
                self._procs.append(process)
                self._conns.append(parent)
            spaces: list[tuple[int, Any, Any]] = []
            for s in range(len(shards)):
                spaces += self._expect(s, "spaces")
            spaces.sort(key=lambda item: item[0])
            check_same_spaces(spaces)
            self.spec, _, _ = spec_from_spaces(spaces[0][1], spaces[0][2], len(fns))
            layout = slot_layout(self.spec.numel, self.spec.observation, self.spec.action)
            size = layout_nbytes(layout)
            block = SharedBlock(size)
            try:
                for s, conn in enumerate(self._conns):
                    conn.send((size, layout))
                    assert block.fd is not None
                    send_handle(conn, block.fd, self._procs[s].pid)
            finally:
                block.close_fd()
            self.arrays = group_views(block.views(layout))
            for s in range(len(shards)):
                self._expect(s, "ready")
        except BaseException:
            self.close_now()
            raise

    def _expect(self, s: int, what: str) -> Any:
        """A start-up message (blocking: this runs on the collector's thread, not the event loop)."""
        conn = self._conns[s]
        if not conn.poll(START_TIMEOUT):
            raise WorkerError(s, self._procs[s].pid, None, f"env worker did not send its {what} in {START_TIMEOUT}s")
        try:
            tag, payload = conn.recv()
        except (EOFError, OSError):
            self._procs[s].join(5.0)
            raise WorkerCrashedError(s, self._procs[s].pid, self._procs[s].exitcode, during_startup=True) from None
        if tag == "failed":
            raise worker_error_from_message(s, self._procs[s].pid, payload)
        return payload

    async def _call(self, s: int, message: bytes) -> None:
        conn = self._conns[s]
        try:
            conn.send_bytes(message)
            while not conn.poll():
                await anyio.wait_readable(conn.fileno())
            reply = conn.recv_bytes()
        except (EOFError, OSError):
            process = self._procs[s]
            with anyio.move_on_after(5.0):
                await anyio.wait_readable(process.sentinel)
            process.join(1.0)
            raise WorkerCrashedError(s, process.pid, process.exitcode) from None
        if reply[:1] == _FAILED:
            raise worker_error_from_message(s, self._procs[s].pid, pickle.loads(reply[1:]))

    # -- driven from the collector's thread (the barrier-free loop runs there) -------------------
    drives_sync = True

    def send(self, shard: int, rows: np.ndarray) -> None:
        """Start shard ``shard``'s step of ``rows`` (their actions are in the block already)."""
        try:
            self._conns[shard].send_bytes(_STEP + rows.astype(np.int64, copy=False).tobytes())
        except OSError:
            pass  # the worker is gone: finish() reports how it ended

    def wait(self, timeout: float) -> list[int]:
        """The shards whose reply (or end) is readable, waiting at most ``timeout`` seconds."""
        ready = _wait_conns(self._conns, timeout)
        return [self._conns.index(conn) for conn in ready]

    def finish(self, shard: int) -> None:
        """Read shard ``shard``'s reply: nothing, or its worker's failure raised here."""
        conn = self._conns[shard]
        try:
            reply = conn.recv_bytes()
        except (EOFError, OSError):
            process = self._procs[shard]
            process.join(5.0)
            raise WorkerCrashedError(shard, process.pid, process.exitcode) from None
        if reply[:1] == _FAILED:
            raise worker_error_from_message(shard, self._procs[shard].pid, pickle.loads(reply[1:]))

    async def reset(self, seeds: Sequence[int | None] | None) -> None:
        async def one(s: int) -> None:
            rows = self.shards[s].tolist()
            await self._call(s, _RESET + pickle.dumps((rows, None if seeds is None else [seeds[i] for i in rows])))

        async with anyio.create_task_group() as tg:
            for s in range(len(self.shards)):
                tg.start_soon(one, s)

    async def step(self, shard: int, rows: np.ndarray) -> None:
        await self._call(shard, _STEP + rows.astype(np.int64, copy=False).tobytes())

    async def reset_rows(self, shard: int, rows: np.ndarray) -> None:
        await self._call(shard, _RESET + pickle.dumps((rows.tolist(), None)))

    async def aclose(self, timeout: float) -> None:
        try:
            with anyio.move_on_after(timeout):
                for conn in self._conns:
                    try:
                        conn.send_bytes(_CLOSE)
                    except (OSError, ValueError):
                        pass
                for process in self._procs:
                    if process.exitcode is None:
                        await anyio.wait_readable(process.sentinel)
        finally:  # also after a wait that failed: the processes end all the same
            self.close_now()

    def close_now(self) -> None:
        for process in self._procs:
            if process.exitcode is None:
                process.join(0.0)
            if process.exitcode is None:
                kill_group(process.pid)
            process.join(5.0)
            if process.exitcode is not None:
                sweep_group(process.pid)
                process.close()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []


def env_worker_main(conn: Any, spec: bytes) -> None:
    """A worker process: build the envs, then step the rows the parent names until told to close."""
    leader = lead_new_group()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    may_start_processes()  # an env's own processes die with this worker's group
    hide_from_forked_children([conn.fileno()])
    shard: EnvShard | None = None
    steps = 0
    try:
        shard = _start(conn, spec)
        while True:
            msg = conn.recv_bytes()
            tag = msg[:1]
            if tag == _STEP:
                rows = np.frombuffer(msg, np.int64, offset=1)
                shard.step(rows)
                steps += len(rows)
            elif tag == _RESET:
                rows, seeds = pickle.loads(msg[1:])
                shard.reset(rows, seeds)
            else:
                break
            conn.send_bytes(_OK)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the parent is gone (or closed the pipe): nothing to report to
    except BaseException as exc:
        _report(conn, exc, b"" if shard is None else _FAILED, steps)
    finally:
        if shard is not None:
            try:
                shard.close()
            except Exception:
                pass
        if leader:
            from .._workers._launch_group import end_group_but_self

            end_group_but_self()


def _start(conn: Any, spec: bytes) -> EnvShard:
    import cloudpickle

    from ._slots import env_name

    envs: dict[int, Any] = {}
    plan = cloudpickle.loads(spec)
    if plan["affinity"] is not None:  # before the envs (and torch's threads) exist: they inherit it
        os.sched_setaffinity(0, plan["affinity"])
    try:
        for i, fn, kw in plan["envs"]:
            envs[i] = env = build_env(fn, kw)
            envs[i] = env = single_env(env, i)
            if is_coroutine_env(env):
                raise TypeError(
                    f"env {i} is a coroutine env: coroutine envs step on the collector's event loop, not in env "
                    "worker processes; drop env_backend='multiprocessing'"
                )
    except BaseException:
        for env in envs.values():
            close = getattr(env, "close", None)
            if close is not None and not is_coroutine_env(env):
                try:
                    close()
                except Exception:  # the build error is the one to report
                    pass
        raise
    names = {i: env_name(e, i) for i, e in envs.items()}
    conn.send(("spaces", [(i, e.observation_space, e.action_space) for i, e in envs.items()]))
    size, layout = conn.recv()
    fd = recv_handle(conn)
    block = SharedBlock(size, fd)
    block.close_fd()
    arrays = group_views(block.views(layout))
    first = next(iter(envs.values()))
    _, obs_leaves, act_leaves = spec_from_spaces(first.observation_space, first.action_space, 1)
    shard = EnvShard(envs, obs_leaves, act_leaves, arrays, names)
    conn.send(("ready", None))
    return shard


def _report(conn: Any, exc: BaseException, tag: bytes, steps: int) -> None:
    """Send the failure: as a start-up message (``tag`` empty) or as a step's reply."""
    try:
        payload: bytes | None = pickle.dumps(exc)
    except Exception:
        payload = None
    failed = Failed(None if not tag else steps, payload, f"{type(exc).__name__}: {exc}", traceback.format_exc())
    try:
        if tag:
            conn.send_bytes(tag + pickle.dumps(failed))
        else:
            conn.send(("failed", failed))
    except (OSError, ValueError):
        pass

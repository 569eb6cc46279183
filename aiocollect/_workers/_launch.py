"""How the distributed transport starts collection nodes: local processes, submitit jobs, or not at all.

A launcher only starts and kills; everything else (joining, data, death) goes through the
node's connection to the trainer, the same whichever launcher started it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ._launch_group import die_with_group, end_group_but_self, kill_group, lead_new_group, sweep_group

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext

__all__ = [
    "Launcher",
    "MpLauncher",
    "SubmititLauncher",
    "cancel_job",
    "end_job",
    "kill_tree",
    "run_leading_group",
    "submitit_executor",
]

#: TorchRL's SLURM defaults, which ``slurm_kwargs`` update.
DEFAULT_SLURM_CONF = {"timeout_min": 10, "slurm_partition": "train", "cpus_per_task": 32, "gpus_per_node": 0}

#: Seconds a submitit local job may take to end after its node did (or after a cancel).
LOCAL_EXIT_GRACE = 5.0


class Launcher:
    """Starts node ``rank`` running ``node_main(master_addr, store_port, rank, bind_host)``."""

    can_kill = True

    def launch(self, rank: int, args: tuple[Any, ...]) -> None:
        """Start the node with rank ``rank`` (``args`` are `node_main`'s)."""

    def sentinel(self, rank: int) -> int | None:
        """A descriptor that becomes readable when the node's process ends (if known)."""
        return None

    def exitcode(self, rank: int) -> int | None:
        """The node's exit code once it has ended (``None``: unknown or still running)."""
        return None

    def kill(self, rank: int) -> None:
        """Kill the node now (its connection then closes)."""

    def reap(self, rank: int, timeout: float) -> None:
        """Wait up to ``timeout`` for the node to end, killing it after; blocking, run off the loop."""

    def release_ended(self, rank: int) -> bool:
        """Free what is held for node ``rank`` if it has ended, without blocking: True if it had.

        False where the launcher cannot tell at once; then `reap` (off the loop) does it.
        """
        return False

    def close(self) -> None:
        """Kill whatever is still running."""


class MpLauncher(Launcher):
    """Local processes, from the fork server (like subprocess workers) or spawned."""

    def __init__(
        self,
        start_method: str,
        main: Callable[..., None] | None = None,
        preload: Sequence[str] = (),
        fork_server: bool = False,
    ) -> None:
        from ._prestart import preload_forkserver

        self._main = main
        # What a node imports before it forks its own fork server (None: it forks none).
        self._server_preload = tuple(preload) if fork_server else None
        # get_context(str) is typed BaseContext, which declares no Process; the start methods
        # the options allow (START_METHODS: "forkserver", "spawn") give one of these two.
        self._ctx = cast("ForkServerContext | SpawnContext", multiprocessing.get_context(start_method))
        if start_method == "forkserver":
            preload_forkserver(self._ctx, preload)  # what each node would import after its fork
        self._procs: dict[int, Any] = {}
        self._codes: dict[int, int] = {}  # exit codes of released processes
        self._alive: dict[int, Any] = {}  # write ends whose EOF tells a node that this process died

    def launch(self, rank: int, args: tuple[Any, ...]) -> None:
        from ._distributed_node import node_main
        from ._prestart import run_in_environ
        from ._subprocess import _check_not_bootstrapping, start_leaving_start_method

        _check_not_bootstrapping()
        self._codes.pop(rank, None)
        alive_r, alive_w = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=run_in_environ,
            args=(dict(os.environ), run_leading_group, alive_r, self._server_preload, self._main or node_main, *args),
            name=f"aiocollect-node-{rank}",
            daemon=True,
        )  # fmt: skip
        try:
            start_leaving_start_method(process)
        except BaseException:
            alive_w.close()
            raise
        finally:
            alive_r.close()  # the node has its own copy
        self._procs[rank], self._alive[rank] = process, alive_w

    def sentinel(self, rank: int) -> int | None:
        p = self._procs.get(rank)
        return None if p is None else p.sentinel

    def exitcode(self, rank: int) -> int | None:
        p = self._procs.get(rank)
        return self._codes.get(rank) if p is None else p.exitcode

    def _release(self, rank: int) -> None:
        p = self._procs.get(rank)
        if p is not None and p.exitcode is not None:
            sweep_group(p.pid)  # what the node's env started and left running
            self._codes[rank] = p.exitcode
            del self._procs[rank]
            p.close()  # its sentinel (a descriptor) goes now, not whenever the collector is collected
            self._alive.pop(rank).close()

    def kill(self, rank: int) -> None:
        p = self._procs.get(rank)
        if p is not None and p.exitcode is None and p.pid is not None:
            kill_group(p.pid)  # the node and every process its env started

    def release_ended(self, rank: int) -> bool:
        p = self._procs.get(rank)
        if p is not None and p.exitcode is None:  # a non-blocking poll
            return False
        self._release(rank)
        return True

    def reap(self, rank: int, timeout: float) -> None:
        p = self._procs.get(rank)
        if p is None:
            return
        p.join(timeout)
        if p.exitcode is None:
            p.terminate()
            p.join(1.0)
        if p.exitcode is None:
            self.kill(rank)
            p.join(5.0)
        self._release(rank)

    def close(self) -> None:
        for rank in list(self._procs):
            self.kill(rank)
        for rank, p in list(self._procs.items()):
            p.join(1.0)
            self._release(rank)


def run_leading_group(alive: Any, server_preload: Sequence[str] | None, main: Callable[..., None], *args: Any) -> None:
    """Run ``main(*args)`` as the leader of a new process group (a node started by `MpLauncher`).

    Its env's processes then share its group, which the launcher kills with it (see
    ``_launch_group``); when ``main`` returns, those still running end with it; and when the
    launching process dies (``alive`` reads EOF), the whole group ends at once, as a subprocess
    worker's does. Unless ``server_preload`` is None, the node first imports those modules and
    forks its own fork server (for its collector's workers) from itself (`fork_forkserver`).
    """
    leader = lead_new_group()
    # Now, while this is the only thread (an import of the user's modules that started one
    # leaves the server to multiprocessing, as before).
    if server_preload is not None and threading.active_count() == 1:
        from ._forked_server import fork_forkserver

        fork_forkserver(server_preload)
    watcher = threading.Thread(target=_watch_launcher, args=(alive, leader), name="aiocollect launcher watcher")
    watcher.daemon = True
    watcher.start()
    try:
        main(*args)
    finally:
        end_group_but_self()


def _watch_launcher(alive: Any, leader: bool) -> None:
    try:
        alive.recv_bytes()  # the launcher never writes: this returns at its death
    except (EOFError, OSError):
        pass
    die_with_group(leader)


class SubmititLauncher(Launcher):
    """Jobs through submitit: SLURM where it exists, submitit's local executor elsewhere."""

    def __init__(self, slurm_kwargs: dict[str, Any], folder: str, main: Callable[..., None] | None = None) -> None:
        self._main = main
        self._executor = submitit_executor(folder, {**DEFAULT_SLURM_CONF, **slurm_kwargs})
        self._jobs: dict[int, Any] = {}
        self._lock = threading.Lock()

    def launch(self, rank: int, args: tuple[Any, ...]) -> None:
        from ._distributed_node import node_main

        with self._lock:
            self._jobs[rank] = self._executor.submit(self._main or node_main, *args)

    def kill(self, rank: int) -> None:
        job = self._jobs.get(rank)
        if job is not None:
            cancel_job(job)

    def reap(self, rank: int, timeout: float) -> None:
        job = self._jobs.pop(rank, None)
        if job is not None:
            end_job(job, timeout)

    def close(self) -> None:
        jobs, self._jobs = dict(self._jobs), {}
        for job in jobs.values():
            cancel_job(job)
        for job in jobs.values():
            end_job(job, 0.0)


def submitit_executor(folder: str, params: dict[str, Any]) -> Any:
    """A submitit executor: SLURM where it exists, else the local executor (without ``slurm_*`` settings)."""
    import submitit

    cluster = None if submitit.AutoExecutor.which() == "slurm" else "local"
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    if cluster == "local":  # slurm-only settings mean nothing to the local executor
        params = {k: v for k, v in params.items() if not k.startswith("slurm_")}
    executor.update_parameters(**params)
    return executor


def cancel_job(job: Any) -> None:
    """Cancel a submitit job, quietly (it may have ended)."""
    try:
        job.cancel(check=False)  # local executor: SIGINT, its controller then ends the job
    except Exception:
        pass


def end_job(job: Any, timeout: float) -> None:
    """Give a job ``timeout`` seconds (plus the local executor's exit grace) to end, then cancel it.

    Blocking; run off the event loop.
    """
    # The local executor's controller process (submitit has no public handle for it); a
    # SLURM job has none, and the scheduler cleans up after it.
    proc: subprocess.Popen[bytes] | None = getattr(job, "_process", None)
    if proc is None:
        if not job.done():
            cancel_job(job)
        return
    # A local job outlives its function by the result pickle, the interpreter's exit and the
    # controller's next poll: give it that long before cancelling it.
    try:
        proc.wait(timeout + LOCAL_EXIT_GRACE)
        return
    except subprocess.TimeoutExpired:
        cancel_job(job)
    try:
        proc.wait(LOCAL_EXIT_GRACE)  # the controller sends SIGINT, then SIGKILL after 1 s
    except subprocess.TimeoutExpired:
        # The controller did not act on the cancel (a process started with SIGINT ignored,
        # as a background job of a non-interactive shell is, keeps it ignored). Killing the
        # controller alone would orphan its task processes, so the whole tree goes.
        kill_tree(proc.pid)
        proc.wait()


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (those found before the kill; Linux /proc).

    Children are listed first and the parent killed first, so none can start another.
    Elsewhere only ``pid`` itself is killed.
    """
    tree = [pid, *_descendants(pid)]
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out

"""The fork server: what it preloads, its early start, and the environment of what it forks.

Workers of a local multi-process collector (and ``launcher="mp"`` nodes) are forked from one
fork server per process, which imports torch and the worker loop once (about a second). The
parent, meanwhile, needs tensordict to build batches, which costs as much again. Done one
after the other, a script's first batch costs both; so looking up a multi-process
collector's class from ``aiocollect`` starts the fork server *before* that import, and the
two run side by side on two cores (`prestart_forkserver`).

A forked process inherits the fork server's environment, fixed when the server started. A
worker instead takes the parent's ``os.environ`` as it is when the worker starts
(`run_in_environ`), as a spawned process does: a variable set after the lookup (say
``CUDA_VISIBLE_DEVICES`` or an env library's own settings) reaches the workers. Variables
read when torch is imported (``OMP_NUM_THREADS``) act in the fork server, at its start.

This module imports nothing heavy: it runs before tensordict is imported.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = [
    "FORKSERVER_PRELOAD",
    "WORKER_MAIN_PRELOAD",
    "leaving_start_method",
    "node_preload",
    "preload_forkserver",
    "prestart_forkserver",
    "remove_temp_dir_before_kill",
    "run_in_environ",
]

# What the fork server imports once, so each worker it forks starts with torch and the worker
# loop loaded. Not tensordict: a worker with a plain nn.Module policy never needs it.
FORKSERVER_PRELOAD = [
    "torch", "numpy", "gymnasium", "aiocollect._workers._subprocess_main",
    "aiocollect._rollout._config", "aiocollect._rollout._policy", "aiocollect._rollout._rollout",
    "aiocollect._envs._gym",
    "aiocollect._workers._forkserver",  # last: freezes what the others loaded
]  # fmt: skip


#: What a node program imports on top of that, by the module of its ``worker_main``: the
#: collector that a `DistributedCollector` node runs needs tensordict; the plain worker loop
#: does not. Imported by each node after its fork, these cost every node its own copy (124 MB
#: of a `DistributedCollector` node's 268; with 16 nodes, 13 s to the first batch on two
#: cores, against 4.6 s preloaded) and the kernel frees that copy at each node's exit.
WORKER_MAIN_PRELOAD: dict[str, tuple[str, ...]] = {
    "aiocollect._dist._node": ("tensordict", "aiocollect._collect._collector", "aiocollect._dist._node"),
}

_START_LOCK = threading.Lock()


@contextmanager
def leaving_start_method() -> Iterator[None]:
    """Start processes (or the fork server) inside, leaving the global start method as it was.

    Starting a process makes multiprocessing fix the *global* start method (it records it for
    the child), after which the user's own ``set_start_method()`` fails. A library must not do
    that: undo it if it was unset before. Processes start from several threads at once.
    """
    with _START_LOCK:
        default = getattr(multiprocessing.context, "_default_context", None)
        unset = getattr(default, "_actual_context", False) is None
        try:
            yield
        finally:
            if unset:
                default._actual_context = None  # type: ignore[union-attr]


def _server() -> Any:
    from multiprocessing import forkserver

    return forkserver._forkserver


def preload_forkserver(ctx: Any, extra: Sequence[str] = ()) -> None:
    """Give the fork server aiocollect's preload list and ``extra``, unless it already runs.

    The server is shared by the process: whoever starts it first chooses what it preloads.
    A process forked from a server started without ``extra`` imports it itself, as it would
    have anyway. The server also imports what each process it forks would import again when
    it re-imports the main script (`main_imports`: tensordict, for a script that imports a
    collector class or tensordict at its top).
    """
    if _server()._forkserver_pid is None:
        from ._main_imports import main_imports

        *preload, freeze = FORKSERVER_PRELOAD
        more = [m for m in dict.fromkeys([*extra, *main_imports()]) if m not in preload]
        ctx.set_forkserver_preload([*preload, *more, freeze])


def node_preload(node_modules: Sequence[str], worker_main: str) -> list[str]:
    """What to preload for nodes that run ``node_modules`` and then ``worker_main`` (``module:function``)."""
    return [*node_modules, *WORKER_MAIN_PRELOAD.get(worker_main.partition(":")[0], ())]


def prestart_forkserver() -> bool:
    """Start the fork server now, in the background, if a local collector would start it later.

    Nothing happens where the fork server is not the default start method, where it already
    runs, or in a process started by ``multiprocessing`` (a worker that re-imports the main
    module must not start a server of its own). Returns whether a server was started.
    Never waits for the server's preload: that is the point.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    if multiprocessing.parent_process() is not None or getattr(multiprocessing.current_process(), "_inheriting", False):
        return False
    if _server()._forkserver_pid is not None:
        return False
    with leaving_start_method():  # the server's preparation data reads the global start method
        preload_forkserver(multiprocessing.get_context("forkserver"))
        _server().ensure_running()  # spawns the server and returns; the server preloads on its own
    return True


def run_in_environ(environ: Mapping[str, str], target: Callable[..., None], *args: Any) -> None:
    """In a forked worker: take the parent's environment ``environ``, then run ``target(*args)``."""
    for key in [k for k in os.environ if k not in environ]:
        del os.environ[key]
    os.environ.update(environ)
    target(*args)


def remove_temp_dir_before_kill() -> None:
    """Remove this process's multiprocessing temp dir, for a process about to be killed.

    A killed process runs no exit handlers, so the temp dir it would remove at exit stays
    in /tmp (``pymp-*``, which holds the fork server's socket): one per Ray actor whose
    collector started local workers, on every run. The fork server itself ends with the
    process (it watches a pipe from it). Only for a process that starts nothing after this:
    its fork server's address is gone.
    """
    with _START_LOCK:
        tempdir = multiprocessing.current_process()._config.pop("tempdir", None)  # type: ignore[attr-defined]
    if tempdir is not None:
        shutil.rmtree(tempdir, ignore_errors=True)

"""A node's own fork server, forked from the node instead of started as a new interpreter.

A node that runs a multi-process collector forks its workers from a fork server of its own.
multiprocessing starts that server as a new interpreter, which imports torch and the worker
loop all over again: about a second and a half of CPU per node, while the node itself, fresh
from the trainer's fork server, already holds all of it. `fork_forkserver` starts the server
by forking the node instead, right at its start while it is still single-threaded (the one
state in which a fork is safe, and the state the trainer's fork server forks it in). The
server it makes is multiprocessing's own: the same program, run in the forked child instead
of in a new interpreter; the node's multiprocessing then uses it as if it had started it.
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ._prestart import leaving_start_method, preload_forkserver

__all__ = ["fork_forkserver"]


def fork_forkserver(preload: Sequence[str] = ()) -> bool:
    """Import ``preload``, then start this process's fork server by forking this process; True if it did.

    Call it only while this process has a single thread. Nothing happens where the fork
    server is not available or already runs. ``preload`` names what the process would import
    later anyway (tensordict, for a node): imported before the fork, the server and every
    worker share it instead of each importing a copy. A module that cannot be imported is
    skipped, as multiprocessing's own preload does.
    """
    from multiprocessing import forkserver, resource_tracker, util

    server: Any = forkserver._forkserver  # multiprocessing's one instance (private)
    if "forkserver" not in multiprocessing.get_all_start_methods() or server._forkserver_pid is not None:
        return False
    if threading.active_count() != 1:
        raise RuntimeError("fork_forkserver() forks this process: call it before any other thread starts")
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    resource_tracker.ensure_running()  # a process of its own, as it is (multiprocessing shares it)
    spawn = util.spawnv_passfds
    util.spawnv_passfds = _fork_passfds  # type: ignore[assignment]  # what ensure_running starts the server with
    try:
        with leaving_start_method():
            preload_forkserver(multiprocessing.get_context("forkserver"))
            server.ensure_running()
    finally:
        util.spawnv_passfds = spawn
    return True


def _fork_passfds(path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
    """`util.spawnv_passfds` for the fork server's own command, run in a forked child instead."""
    flag, program = args[-2:]
    if flag != "-c":  # pragma: no cover - multiprocessing changed how it starts its server
        raise RuntimeError(f"unexpected fork server command {list(args)!r}")
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _cover_all_but(passfds)
        # What the node imported after the trainer's fork server froze its heap: freeze it
        # too, or each worker's first collection walks (and copies) all of it.
        gc.collect()
        gc.freeze()
        exec(program, {"__name__": "__aiocollect_forkserver__"})  # runs until the node is gone
        code = 0
    except SystemExit as exc:  # how the server ends once its clients are gone
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        sys.excepthook(*sys.exc_info())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # never the node's own exit handlers


def _cover_all_but(keep: Sequence[int]) -> None:
    """Point every descriptor but stdio and ``keep`` at /dev/null, as an exec'd server would not have them.

    Covered, not closed (`cover_fds`): the node's objects that own them (its connections)
    still name these numbers, and closing one of those later would close whatever reused it.
    """
    from ._launch_group import cover_fds

    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd")]
    except OSError:  # pragma: no cover - neither listing exists
        fds = []
    cover_fds([fd for fd in fds if fd not in {0, 1, 2, *keep}])

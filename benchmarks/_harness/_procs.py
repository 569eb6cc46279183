"""Processes: fresh interpreters for one measurement each, and the children a collector must not leave."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

from ._report import NAN, log

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_TAG = "BENCH_RESULT "  # prefixes a child process's JSON result line on stdout
# Long-lived helpers of multiprocessing and torch: direct children, never a collector's worker.
K = TypeVar("K", bound=Hashable)
HELPERS = ("resource_tracker", "forkserver", "torch_shm_manager", "semaphore_tracker")

# --------------------------------------------------------------------------------------------
# Children of this process
# --------------------------------------------------------------------------------------------


def child_processes() -> tuple[list[Any], list[Any]]:
    """(workers, helpers): this process's descendants as ``psutil.Process`` objects (empty lists
    without psutil). A helper is a direct child running one of ``HELPERS``; processes forked by
    a fork server share its command line but are its children, hence workers."""
    try:
        import psutil
    except ImportError:
        return [], []
    me = os.getpid()
    workers: list[Any] = []
    helpers: list[Any] = []
    for p in psutil.Process().children(recursive=True):
        try:
            helper = p.ppid() == me and any(h in " ".join(p.cmdline()) for h in HELPERS)
        except psutil.ZombieProcess:
            helper = False
        except psutil.Error:
            continue
        (helpers if helper else workers).append(p)
    return workers, helpers


def _describe(p: Any) -> str:
    import psutil

    try:
        return f"{p.pid} <zombie>" if p.status() == psutil.STATUS_ZOMBIE else f"{p.pid} {' '.join(p.cmdline())[:80]}"
    except psutil.Error:
        return f"{p.pid} <gone>"


def live_children(threads_baseline: set[int] | None = None) -> tuple[list[str], list[str]]:
    """(child processes, and threads not in ``threads_baseline``, still alive; long-lived helpers).
    The thread of multiprocessing's resource sharer, started the first time a file descriptor is
    sent to a spawned process and serving for the process's lifetime, is a helper."""
    import multiprocessing

    found = {p.pid: f"{p.pid} {p.name}" for p in multiprocessing.active_children()}  # also reaps
    workers, helpers = child_processes()
    found.update({p.pid: _describe(p) for p in workers if p.pid not in found})
    helper_pids = {p.pid for p in helpers}
    left = [f"process {d}" for pid, d in found.items() if pid not in helper_pids]
    keep = [f"process {_describe(p)}" for p in helpers]
    if threads_baseline is not None:
        for t in threading.enumerate():
            if t.ident in threads_baseline or not t.is_alive():
                continue
            sharer = getattr(getattr(t, "_target", None), "__qualname__", "") == "_ResourceSharer._serve"
            (keep if sharer else left).append(f"thread {t.name}")
    return left, keep


def wait_children_gone(timeout: float = 3.0, threads_baseline: set[int] | None = None) -> list[str]:
    """What `live_children` still finds after up to ``timeout`` seconds."""
    deadline = time.perf_counter() + timeout
    while True:
        left, _ = live_children(threads_baseline)
        if not left or time.perf_counter() > deadline:
            return left
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------
# Fresh processes, each in its own process group, killed on timeout
# --------------------------------------------------------------------------------------------


def group_alive(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    alive = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":  # fields: state, ppid, pgrp, ...
            alive.append(int(name))
    return alive


def killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_process(argv: list[str], timeout: float, exit_grace: float = 5.0) -> dict[str, Any]:
    """Run ``argv`` in a new session (its own process group). Returns its result line (the last
    one printed after ``RESULT_TAG``, parsed), or an ``error`` (no result within ``timeout`` s,
    or none at exit, with the end of its stderr), plus ``wall_s`` (start to exit),
    ``returncode``, ``exit_note`` (it printed its result but did not exit within ``exit_grace``
    s: killed) and ``group_left_alive`` (processes of its group alive 5 s after it exited:
    killed)."""
    t0 = time.perf_counter()
    err_file = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err_file, text=True, start_new_session=True)
    result: list[dict[str, Any]] = []
    wake = threading.Event()  # the result line arrived, or the process ended
    t_exit: list[float] = []

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith(RESULT_TAG):
                result.append(json.loads(line[len(RESULT_TAG) :]))
                wake.set()

    def wait() -> None:
        p.wait()
        t_exit.append(time.perf_counter())
        wake.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    threading.Thread(target=wait, daemon=True).start()
    note = None
    try:
        wake.wait(timeout)
        if not t_exit:
            if result:
                try:
                    p.wait(exit_grace)
                except subprocess.TimeoutExpired:
                    note = f"did not exit within {exit_grace:g} s after its result (killed)"
            else:
                note = f"timed out after {timeout:g} s (killed)"
    except BaseException:  # Ctrl-C: the child is in its own session and did not get it
        killpg(p.pid)
        p.wait()
        raise
    if p.poll() is None:
        killpg(p.pid)
        p.wait()
    wall = (t_exit[0] if t_exit else time.perf_counter()) - t0
    reader.join(5.0)
    deadline = time.perf_counter() + 5.0
    left = group_alive(p.pid)
    while left and time.perf_counter() < deadline:  # workers, a fork server: gone shortly
        time.sleep(0.05)
        left = group_alive(p.pid)
    if left:
        killpg(p.pid)
    err_file.seek(0)
    stderr = err_file.read()
    err_file.close()
    res = result[-1] if result else {}
    if not result:
        res["error"] = f"child {note or f'exited with {p.returncode}'} after {wall:.1f} s without a result"
    elif note:
        res["exit_note"] = note
    if "error" in res:
        res["stderr"] = stderr[-3000:]
    res.update(wall_s=wall, returncode=p.returncode, group_left_alive=left)
    return res


def time_command(code: str, timeout: float) -> float:
    """Wall seconds of ``python -c code`` in a fresh process, start to exit (nan if it fails)."""
    r = run_process([sys.executable, "-c", code], timeout)
    if r["returncode"] != 0:
        log(f"  WARNING: python -c {code!r} failed ({r['returncode']}): {r.get('stderr', '').strip()[-300:]}")
        return NAN
    return float(r["wall_s"])


def run_child(module: str, cfg: dict[str, Any], timeout: float, exit_grace: float = 15.0) -> dict[str, Any]:
    """Run ``module._child_entry(cfg_json, t_start)`` (which calls `child_entry`) in a fresh
    process, with the benchmarks directory on its path; ``t_start`` is taken as the interpreter
    starts, before any import. Returns what `run_process` does."""
    code = (
        "import time; _t = time.perf_counter(); import sys; "
        f"sys.path.insert(0, {BENCHMARKS!r}); import {module}; {module}._child_entry(sys.argv[1], _t)"
    )
    return run_process([sys.executable, "-c", code, json.dumps(cfg)], timeout, exit_grace)


def fresh_rounds(
    module: str,
    plan: Sequence[K],
    repeats: int,
    cfg: Callable[[K, int], dict[str, Any]],
    timeout: float,
    *,
    exit_grace: float = 15.0,
    rounds: int | None = None,
    before_round: Callable[[int], None] | None = None,
    on_result: Callable[[K, int, dict[str, Any], dict[str, Any]], None] | None = None,
) -> dict[K, list[dict[str, Any]]]:
    """Run every row of ``plan`` in a fresh process (`run_child`), ``repeats`` times, round robin.

    Rows run round robin, one process of each per round, so that a drift of the machine's speed
    hits every row alike; ``before_round`` takes the round's reference samples (the import
    floor) first, for the same reason. ``rounds`` may exceed ``repeats`` to sample the
    reference more often than the rows: the later rounds run ``before_round`` only.

    Args:
        module: the script's module name; its ``_child_entry`` runs in the child.
        plan: the rows' keys, in the order they run in each round.
        repeats: fresh processes per row.
        cfg: ``(key, round) -> config`` (JSON-able) for one child.
        timeout: seconds a child may take to print its result before it is killed.
        exit_grace: seconds it may take to exit after its result.
        rounds: rounds in all (default ``repeats``).
        before_round: called with the round (from 0) at its start.
        on_result: ``(key, round, config, result)``, after each child (its log line).

    Returns:
        ``{key: [result of each round]}`` (`run_process`'s records).
    """
    results: dict[K, list[dict[str, Any]]] = {k: [] for k in plan}
    for rep in range(max(repeats, rounds or 0)):
        if before_round is not None:
            before_round(rep)
        for key in plan if rep < repeats else ():
            c = cfg(key, rep)
            r = run_child(module, c, timeout, exit_grace)
            results[key].append(r)
            if on_result is not None:
                on_result(key, rep, c, r)
    return results


def child_entry(main: Callable[[dict[str, Any], float], dict[str, Any]], cfg_json: str, t_start: float) -> None:
    """In the child: run ``main(cfg, t_start)`` and print its result, or its error, as one line."""
    try:
        res = main(json.loads(cfg_json), t_start)
    except BaseException as exc:  # reported to the parent as data
        import traceback

        res = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    print(RESULT_TAG + json.dumps(res, default=str), flush=True)


def free_port_block(used: set[int], width: int = 1) -> int:
    """A port p < 65536 such that p .. p + width - 1 are all free now (bound together, then
    released) and none was handed out before (``used``, which this updates)."""
    for _ in range(200):
        socks: list[socket.socket] = []
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("", 0))
            port = int(s.getsockname()[1])
            block = set(range(port, port + width))
            if port + width - 1 >= 65536 or block & used:
                continue
            for q in range(port + 1, port + width):
                t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(t)
                t.bind(("", q))
            used |= block
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("found no block of free TCP ports")

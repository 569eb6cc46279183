"""Resource-leak snapshots for the test suite (used by the autouse ``no_leaks`` fixture).

A :class:`Snapshot` records what this process owns at one moment: live Python threads,
child processes (recursively), entries in ``/dev/shm`` and the number of open file
descriptors. :func:`find_leaks` compares a snapshot taken before a test with one taken
after it and describes everything new; :func:`wait_for_no_leaks` gives threads and
children a grace period to finish before the comparison is final.

The check is deliberately lenient where the platform is noisy (a small fd slack, a few
process-wide helper threads and processes that live for the whole session) and strict
everywhere else: a ``threading.Thread`` or a child process that a test leaves running
is reported.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

try:  # psutil comes with the ``test`` extra; fall back to /proc without it.
    import psutil
except ImportError:  # pragma: no cover - depends on the environment
    psutil = None  # type: ignore[assignment]

__all__ = [
    "FD_SLACK",
    "IGNORED_CHILD_CMDLINE",
    "IGNORED_THREAD_NAMES",
    "LeakError",
    "Snapshot",
    "check_no_leaks",
    "find_leaks",
    "orphans_reparented_here",
    "run_script",
    "take_snapshot",
    "wait_for_no_leaks",
]

#: How many more open file descriptors than before a test are tolerated. Some libraries
#: open a descriptor or two once per process on first use (uvloop/libuv, for example).
FD_SLACK = 3

#: Threads that may outlive a test. They belong to process-wide pools that are idle,
#: daemonic and reused by the next test, so they are not leaks of the test that first
#: started them.
IGNORED_THREAD_NAMES: tuple[re.Pattern[str], ...] = (
    # trio's global thread cache keeps idle workers for 10 s; a worker that is still
    # running a job carries the job's name instead, so a leaked job is still caught.
    re.compile(r"^Trio thread \d+$"),
    # debugger helper threads
    re.compile(r"^pydevd"),
)

#: Child processes that live for the rest of the session once started: the
#: multiprocessing resource tracker and forkserver are shared by every later test.
IGNORED_CHILD_CMDLINE: tuple[re.Pattern[str], ...] = (
    re.compile(r"multiprocessing\.resource_tracker"),
    re.compile(r"multiprocessing\.forkserver"),
)

_SHM_DIR = "/dev/shm"
_FD_DIR = "/proc/self/fd"


class LeakError(AssertionError):
    """Raised by :func:`check_no_leaks` when a test left resources behind."""


@dataclass(frozen=True)
class Snapshot:
    """What this process owned at one moment."""

    #: ``threading.Thread`` objects alive at the time (compared by identity).
    threads: frozenset[threading.Thread] = field(default_factory=frozenset)
    #: ``(pid, start_time) -> command line`` for every descendant process.
    children: dict[tuple[int, float], str] = field(default_factory=dict)
    #: names of the entries in ``/dev/shm``.
    shm: frozenset[str] = field(default_factory=frozenset)
    #: number of open file descriptors of this process.
    fd_count: int = 0


def _threads() -> frozenset[threading.Thread]:
    return frozenset(t for t in threading.enumerate() if t.is_alive())


def _children_psutil() -> dict[tuple[int, float], str]:
    result: dict[tuple[int, float], str] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            with proc.oneshot():
                key = (proc.pid, proc.create_time())
                status = proc.status()
                try:
                    cmdline = " ".join(proc.cmdline()) or proc.name()
                except (psutil.AccessDenied, psutil.ZombieProcess):
                    cmdline = proc.name()
        except psutil.NoSuchProcess:
            continue
        result[key] = f"{cmdline} [{status}]"
    return result


def _children_proc() -> dict[tuple[int, float], str]:
    """Descendants of this process read straight from /proc (no psutil needed)."""
    parents: dict[int, list[int]] = {}
    info: dict[int, tuple[float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        # comm may contain spaces and parentheses: split after the last ')'
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        rest = stat[stat.rindex(")") + 2 :].split()
        state, ppid, starttime = rest[0], int(rest[1]), float(rest[19])
        parents.setdefault(ppid, []).append(pid)
        info[pid] = (starttime, f"{cmdline or comm} [{state}]")
    result: dict[tuple[int, float], str] = {}
    todo = list(parents.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        if pid in info:
            starttime, desc = info[pid]
            result[(pid, starttime)] = desc
        todo.extend(parents.get(pid, []))
    return result


def _children() -> dict[tuple[int, float], str]:
    if psutil is not None:
        return _children_psutil()
    return _children_proc()  # pragma: no cover - depends on the environment


def _shm() -> frozenset[str]:
    try:
        return frozenset(os.listdir(_SHM_DIR))
    except OSError:  # no /dev/shm on this platform
        return frozenset()


def _fd_count() -> int:
    try:
        return len(os.listdir(_FD_DIR))
    except OSError:  # pragma: no cover - no procfs
        return 0


def take_snapshot() -> Snapshot:
    """Record the threads, child processes, /dev/shm entries and fds owned right now."""
    return Snapshot(
        threads=_threads(),
        children=_children(),
        shm=_shm(),
        fd_count=_fd_count(),
    )


def _thread_ignored(thread: threading.Thread) -> bool:
    return any(p.search(thread.name) for p in IGNORED_THREAD_NAMES)


def _child_ignored(cmdline: str) -> bool:
    return any(p.search(cmdline) for p in IGNORED_CHILD_CMDLINE)


def find_leaks(before: Snapshot, after: Snapshot, *, fd_slack: int = FD_SLACK) -> list[str]:
    """Describe every resource in ``after`` that was not in ``before``.

    Returns an empty list when nothing leaked.
    """
    problems: list[str] = []
    new_threads = sorted(
        (t for t in after.threads - before.threads if t.is_alive() and not _thread_ignored(t)),
        key=lambda t: t.name,
    )
    for t in new_threads:
        kind = "daemon thread" if t.daemon else "thread"
        problems.append(f"leaked {kind} {t.name!r} (ident={t.ident})")
    for key in sorted(after.children.keys() - before.children.keys()):
        cmdline = after.children[key]
        if not _child_ignored(cmdline):
            problems.append(f"leaked child process pid={key[0]}: {cmdline}")
    for name in sorted(after.shm - before.shm):
        problems.append(f"leaked /dev/shm entry {name!r}")
    if after.fd_count > before.fd_count + fd_slack:
        problems.append(
            f"leaked file descriptors: {before.fd_count} open before, {after.fd_count} after (slack {fd_slack})"
        )
    return problems


def check_no_leaks(before: Snapshot, after: Snapshot, *, fd_slack: int = FD_SLACK) -> None:
    """Raise :class:`LeakError` listing what leaked between two snapshots."""
    problems = find_leaks(before, after, fd_slack=fd_slack)
    if problems:
        raise LeakError("resources leaked by the test:\n  " + "\n  ".join(problems))


def wait_for_no_leaks(
    before: Snapshot,
    *,
    timeout: float = 5.0,
    interval: float = 0.02,
    fd_slack: int = FD_SLACK,
    snapshot: Callable[[], Snapshot] = take_snapshot,
) -> Snapshot:
    """Poll until nothing new is left over (or ``timeout`` passes); return the last snapshot.

    Threads and child processes that are shutting down get up to ``timeout`` seconds to
    finish. The caller compares the returned snapshot with :func:`check_no_leaks`.
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: wait() is an interruptible sleep
    while True:
        after = snapshot()
        if not find_leaks(before, after, fd_slack=fd_slack):
            return after
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return after
        pause.wait(min(interval, remaining))
        interval = min(interval * 2, 0.25)


_PR_SET_CHILD_SUBREAPER = 36


@contextmanager
def orphans_reparented_here() -> Iterator[None]:
    """Make this process the reaper of orphaned descendants for the duration (Linux only).

    A grandchild whose parent dies is then reparented here instead of to init, so it shows
    up among this process's children (and in the leak check) instead of vanishing from view.
    """
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    if libc is not None and libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        libc = None  # not permitted here: surviving grandchildren would go to init unseen
    try:
        yield
    finally:
        if libc is not None:
            libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


#: Descendants a script run by `run_script` may leave behind: multiprocessing's resource
#: tracker (started by every ``spawn``) exits on its own when the script's end of its pipe
#: closes, i.e. just after the script exits.
ALLOWED_SURVIVORS = re.compile(r"multiprocessing\.resource_tracker")


class _DescendantRecorder:
    """Records the command line of every descendant process, sampled in a thread.

    A process that outlives the script is often a zombie by the time it is seen, when its
    command line can no longer be read: the recorder read it while it was alive.
    """

    def __init__(self, interval: float = 0.02) -> None:
        self.cmdlines: dict[tuple[int, float], str] = {}
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="descendant recorder", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        for key, p in _descendants().items():
            try:  # re-read each time: a child is briefly a copy of its parent before exec
                self.cmdlines[key] = " ".join(p.cmdline())
            except psutil.Error:
                pass  # gone, or a zombie: keep the last command line read

    def __enter__(self) -> _DescendantRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _descendants() -> dict[tuple[int, float], psutil.Process]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            out[(p.pid, p.create_time())] = p
        except psutil.NoSuchProcess:
            pass
    return out


def run_script(
    args: list[str], *, timeout: float, **kwargs: object
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``args`` (a fresh interpreter, as a user runs a script) and list what it left behind.

    This process is made a child subreaper (Linux) meanwhile, so a worker orphaned by the
    script is reparented here instead of to init and is seen. Helpers that exit right after
    the script (a worker reading its parent's EOF) get a moment to go; whatever is left then,
    except `ALLOWED_SURVIVORS`, is killed, reaped and returned as ``"pid N: command line"``.
    ``kwargs`` go to `subprocess.run` (output is captured as text).
    """
    before = _descendants()
    with orphans_reparented_here(), _DescendantRecorder() as recorder:
        try:
            proc = subprocess.run(args, check=False, capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
        finally:
            recorder.sample()  # read what it can while the survivors still have a command line
            survivors = {key: p for key, p in _descendants().items() if key not in before}
            _, alive = psutil.wait_procs(list(survivors.values()), timeout=5)
            survivors = {key: p for key, p in survivors.items() if p in alive}
            for p in survivors.values():  # clean up (kill and reap) before reporting
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(list(survivors.values()), timeout=5)
    leaked = [
        f"pid {key[0]}: {recorder.cmdlines.get(key, '(command line unknown)')[:160]}"
        for key in survivors
        if not ALLOWED_SURVIVORS.search(recorder.cmdlines.get(key, ""))
    ]
    return proc, leaked

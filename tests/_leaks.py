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

What is the test's. Threads, child processes and fds are per-process by construction:
threads are this interpreter's, child processes are this process's descendants, and fds
are counted in this process's own ``/proc/self/fd``, so another program on the machine
never shows up in them. ``/dev/shm`` is shared by the whole machine, so a new entry in it
is a leak of the test only if it is attributable to the test's process tree: this process
and every descendant any snapshot of the comparison saw (``Snapshot.pids``). Deciding in
this order, a new entry is *not* the test's when

1. it is gone by the time it is looked at (it was released, not leaked);
2. it belongs to another user (everything the test starts runs as this user);
3. its name names its creator's pid (``SHM_NAME_PIDS``: torch's ``torch_<pid>_...``,
   multiprocessing's heap arenas ``pym-<pid>-...``) and that pid is alive outside the
   tree; a name naming a pid of the tree makes it the test's whatever else holds it;
4. it is mapped or open (``/proc/<pid>/maps``, ``/proc/<pid>/fd``, matched by inode:
   glibc maps a named semaphore under the temporary name it created it with) only by
   processes outside the tree. Held by any process of the tree, it is the test's.

An entry that nobody holds and whose name says nothing (``sem.mp-*`` from
``multiprocessing.synchronize``, ``psm_*`` from ``multiprocessing.shared_memory``: both
random) is attributed to the test: that is what an entry leaked by a test's exited child
looks like. It is looked at twice, a moment apart, before that verdict, and it keeps
:func:`wait_for_no_leaks` polling, so it is reported only if it is still there, still
unheld, when the grace period is over: a foreign program may close an entry just before
it unlinks it. aiocollect itself names nothing in ``/dev/shm`` (its blocks are memfds).

multiprocessing's temp dirs (``pymp-*`` in the temp dir, each holding a fork server's or a
listener's socket) are removed by the process that made them when it exits; a process that
is killed (or exits with ``os._exit``) leaves its dir behind. A new one counts as the test's
once no process has a socket bound in it (``/proc/net/unix``): the fork server (or listener)
whose socket it holds is gone, and so is whoever should have removed it.

Blind spots, shared with the process check: a process the test double-forks away from its
tree is not the test's, nor is what it holds; and a name naming a pid that has exited and
was never seen in the tree says nothing (rule 4 decides).
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

try:  # psutil comes with the ``test`` extra; fall back to /proc without it.
    import psutil
except ImportError:  # pragma: no cover - depends on the environment
    psutil = None  # type: ignore[assignment]

__all__ = [
    "FD_SLACK",
    "IGNORED_CHILD_CMDLINE",
    "IGNORED_THREAD_NAMES",
    "SHM_NAME_PIDS",
    "LeakError",
    "Snapshot",
    "check_no_leaks",
    "descendants_left_behind",
    "find_leaks",
    "orphans_reparented_here",
    "run_script",
    "still_running",
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

#: ``/dev/shm`` entry names that embed the pid of the process that created them.
SHM_NAME_PIDS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^torch_(\d+)_"),  # torch's file_system sharing strategy: /torch_<pid>_<random>_<n>
    re.compile(r"^pym-(\d+)-"),  # multiprocessing.heap arenas (unlinked at once; seen in between)
)

_SHM_DIR = "/dev/shm"
_FD_DIR = "/proc/self/fd"

#: How long an unheld, unnamed new entry is given before it is looked at again (seconds).
_SHM_RECHECK = 0.05


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
    #: multiprocessing's temp dirs (``pymp-*``) in the temp dir, by path.
    mp_temp_dirs: frozenset[str] = field(default_factory=frozenset)
    #: number of open file descriptors of this process.
    fd_count: int = 0
    #: pids of the tree seen by earlier snapshots of the same comparison (`wait_for_no_leaks`
    #: adds them); a child that has exited since still owns what its pid names.
    seen_pids: frozenset[int] = field(default_factory=frozenset)
    # Verdicts on new /dev/shm entries, made the first time `find_leaks` asks: a repeated
    # comparison of the same snapshots gives the same answer however /dev/shm moved on.
    _shm_verdicts: dict[tuple[str, frozenset[int]], str | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def pids(self) -> frozenset[int]:
        """This process, its descendants at the time and ``seen_pids``: the test's tree."""
        return frozenset({os.getpid(), *(pid for pid, _ in self.children), *self.seen_pids})


def _threads() -> frozenset[threading.Thread]:
    return frozenset(t for t in threading.enumerate() if t.is_alive())


_STATE, _PPID, _STARTTIME = 0, 1, 19  # fields of /proc/<pid>/stat, counted after its comm


def _proc_stat(pid: int) -> tuple[str, list[str]] | None:
    """``(comm, the fields after it)`` from /proc/<pid>/stat; None when it cannot be read.

    comm may contain spaces and parentheses, so the fields start after its last ')'.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    end = stat.rindex(")")
    return stat[stat.index("(") + 1 : end], stat[end + 2 :].split()


def _started(proc: psutil.Process) -> float:
    """When ``proc`` started, as a key that never moves: clock ticks since boot, where /proc has them.

    psutil's ``create_time()`` adds the boot time, which Linux recomputes from the wall clock
    at every read of /proc/stat: while the clock is slewed it steps by a second now and then,
    and every process then looks new. (One CI run's `run_script` took the test process's own
    fork server and resource tracker for the script's survivors that way, and killed them.)
    """
    stat = _proc_stat(proc.pid)
    if stat is None:  # no /proc here, or the process is gone (create_time() then says which)
        return proc.create_time()
    return float(stat[1][_STARTTIME])


def _children_psutil() -> dict[tuple[int, float], str]:
    result: dict[tuple[int, float], str] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            with proc.oneshot():
                key = (proc.pid, _started(proc))
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
        stat = _proc_stat(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if stat is None:
            continue
        comm, rest = stat
        state, ppid, starttime = rest[_STATE], int(rest[_PPID]), float(rest[_STARTTIME])
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


def _mp_temp_dirs() -> frozenset[str]:
    root = tempfile.gettempdir()
    try:
        return frozenset(os.path.join(root, n) for n in os.listdir(root) if n.startswith("pymp-"))
    except OSError:  # pragma: no cover - no temp dir to list
        return frozenset()


def _bound_unix_paths() -> set[str]:
    """Paths of the Unix sockets bound by any live process (``/proc/net/unix``' last column)."""
    try:
        with open("/proc/net/unix") as f:
            next(f)  # the header
            return {parts[7] for line in f if len(parts := line.split()) >= 8}
    except OSError:  # pragma: no cover - no procfs
        return set()


def _new_mp_temp_dirs_of_the_test(before: Snapshot, after: Snapshot) -> list[str]:
    new = sorted(d for d in after.mp_temp_dirs - before.mp_temp_dirs if os.path.isdir(d))
    if not new:
        return []
    bound = _bound_unix_paths()
    return [d for d in new if not any(p.startswith(d + os.sep) for p in bound)]


def _named_pid(name: str) -> int | None:
    for pattern in SHM_NAME_PIDS:
        m = pattern.match(name)
        if m:
            return int(m.group(1))
    return None


def _pid_alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[1][_STATE] not in ("Z", "X")  # a zombie holds nothing any more


def _shm_holders(inodes: dict[tuple[int, int], str], tree: frozenset[int]) -> dict[str, set[int]]:
    """Pids that map or have open each entry, by ``(st_dev, st_ino) -> name``.

    The tree is read first, then every other process (an entry held by someone else is
    someone else's) until each entry has a holder: which other processes hold it changes
    nothing. Processes this user may not inspect are skipped: they run as another user, and
    what they create belongs to that user (rule 2 of the module docstring).
    """
    holders: dict[str, set[int]] = {name: set() for name in inodes.values()}
    shm_prefix = _SHM_DIR.encode() + b"/"
    others = sorted(int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in tree)
    for pid in [*sorted(tree), *others]:
        if pid not in tree and all(holders.values()):
            break
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                maps = f.read()
        except OSError:
            maps = b""
        if shm_prefix in maps:
            for line in maps.splitlines():
                fields = line.split(None, 5)
                if len(fields) < 6 or not fields[5].startswith(shm_prefix):
                    continue
                major, _, minor = fields[3].partition(b":")
                name = inodes.get((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
                if name is not None:
                    holders[name].add(pid)
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if not os.readlink(path).startswith(_SHM_DIR + "/"):
                    continue
                st = os.stat(path)
            except OSError:
                continue
            name = inodes.get((st.st_dev, st.st_ino))
            if name is not None:
                holders[name].add(pid)
    return holders


def _shm_not_the_tests(names: set[str], tree: frozenset[int]) -> dict[str, str | None]:
    """Judge new /dev/shm entries: ``None`` for the test's, else why it is not (module docstring)."""
    verdicts: dict[str, str | None] = {}
    pending = set(names)
    pause = threading.Event()  # never set: wait() is an interruptible sleep
    for look in range(2):
        inodes: dict[tuple[int, int], str] = {}
        for name in sorted(pending):
            try:
                st = os.lstat(os.path.join(_SHM_DIR, name))
            except OSError:
                verdicts[name] = "gone"
                continue
            pid = _named_pid(name)
            if st.st_uid != os.geteuid():
                verdicts[name] = f"owned by uid {st.st_uid}"
            elif pid is not None and pid in tree:
                verdicts[name] = None
            elif pid is not None and _pid_alive(pid):
                verdicts[name] = f"named after pid {pid}, which is not the test's"
            else:
                inodes[(st.st_dev, st.st_ino)] = name
        pending = set()
        for name, pids in _shm_holders(inodes, tree).items() if inodes else ():
            if pids & tree:
                verdicts[name] = None
            elif pids:
                verdicts[name] = f"held only by pids {sorted(pids)}, which are not the test's"
            elif not os.path.lexists(os.path.join(_SHM_DIR, name)):
                verdicts[name] = "gone"  # released while the holders were read
            else:
                pending.add(name)
        if not pending:
            break
        if look == 0:
            pause.wait(_SHM_RECHECK)
    for name in pending:  # nobody holds it, twice: strict
        verdicts[name] = None
    return verdicts


def _new_shm_of_the_test(before: Snapshot, after: Snapshot) -> list[str]:
    tree = before.pids | after.pids
    new = after.shm - before.shm
    unjudged = {name for name in new if (name, tree) not in after._shm_verdicts}
    if unjudged:
        for name, verdict in _shm_not_the_tests(unjudged, tree).items():
            after._shm_verdicts[(name, tree)] = verdict
    return sorted(name for name in new if after._shm_verdicts[(name, tree)] is None)


def _fd_count() -> int:
    try:
        return len(os.listdir(_FD_DIR))
    except OSError:  # pragma: no cover - no procfs
        return 0


def take_snapshot() -> Snapshot:
    """Record the threads, child processes, /dev/shm entries, multiprocessing temp dirs and fds right now."""
    return Snapshot(
        threads=_threads(),
        children=_children(),
        shm=_shm(),
        mp_temp_dirs=_mp_temp_dirs(),
        fd_count=_fd_count(),
    )


def _thread_ignored(thread: threading.Thread) -> bool:
    return any(p.search(thread.name) for p in IGNORED_THREAD_NAMES)


def _child_ignored(cmdline: str) -> bool:
    return any(p.search(cmdline) for p in IGNORED_CHILD_CMDLINE)


def find_leaks(before: Snapshot, after: Snapshot, *, fd_slack: int = FD_SLACK) -> list[str]:
    """Describe every resource in ``after`` that was not in ``before``.

    Returns an empty list when nothing leaked. A new ``/dev/shm`` entry counts only if it is
    the test's (see the module docstring); that is judged by looking at the system when first
    asked, so call this right after taking ``after``.
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
    for name in _new_shm_of_the_test(before, after):
        problems.append(f"leaked /dev/shm entry {name!r}")
    for path in _new_mp_temp_dirs_of_the_test(before, after):
        problems.append(f"leaked multiprocessing temp dir {path!r} (its process was killed or skipped its exit)")
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
    finish. The caller compares the returned snapshot with :func:`check_no_leaks`. Each
    snapshot carries the pids of the tree that the earlier ones saw (``seen_pids``).
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: wait() is an interruptible sleep
    seen = before.pids
    while True:
        after = snapshot()
        seen |= after.pids
        after = replace(after, seen_pids=seen)
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
            out[(p.pid, _started(p))] = p
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


def _session_helpers() -> set[int]:
    """Pids of this process's multiprocessing fork server and resource tracker (shared by later tests)."""
    from multiprocessing import forkserver, resource_tracker

    pids = {getattr(forkserver._forkserver, "_forkserver_pid", None)}
    pids.add(getattr(resource_tracker._resource_tracker, "_pid", None))
    return {pid for pid in pids if pid is not None}


@contextmanager
def descendants_left_behind(grace: float = 5.0) -> Iterator[list[str]]:
    """On exit, list the processes started inside the block that are still running.

    Each descendant of this process that appeared inside the block (except this process's
    fork server and resource tracker) gets ``grace`` seconds to end, and is reaped: an orphan
    that `orphans_reparented_here` brought here is this process's to reap. Those still running
    then are killed, reaped, and added to the yielded list as ``"pid N: command line"``, so
    the leak check of the test sees nothing of them. Use it inside `orphans_reparented_here`
    to see the descendants whose parent died too.
    """
    before = _descendants()
    left: list[str] = []
    with _DescendantRecorder() as recorder:
        try:
            yield left
        finally:
            recorder.sample()
            helpers = _session_helpers()
            new = {key: p for key, p in _descendants().items() if key not in before and key[0] not in helpers}
            _, alive = psutil.wait_procs(list(new.values()), timeout=grace)
            for p in alive:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(alive, timeout=5)
            left.extend(
                f"pid {key[0]}: {recorder.cmdlines.get(key, '(command line unknown)')[:160]}"
                for key, p in new.items()
                if p in alive
            )


def still_running(pids: list[int], timeout: float) -> list[int]:
    """The pids still running (not zombies) after up to ``timeout`` seconds; any may exit while we look."""
    assert psutil is not None, "still_running needs psutil (the test extra)"
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    running = []
    for p in alive:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                running.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return running

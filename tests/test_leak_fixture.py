"""Self-tests for the leak checks behind the autouse ``no_leaks`` fixture."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

try:  # works whether or not tests/ is a package
    from . import _leaks
    from ._leaks import LeakError, check_no_leaks, find_leaks, take_snapshot, wait_for_no_leaks
except ImportError:
    import _leaks  # type: ignore[no-redef]
    from _leaks import LeakError, check_no_leaks, find_leaks, take_snapshot, wait_for_no_leaks

HERE = Path(__file__).resolve().parent


def test_clean_snapshot_has_no_leaks() -> None:
    before = take_snapshot()
    check_no_leaks(before, take_snapshot())


@pytest.mark.parametrize("daemon", [False, True], ids=["thread", "daemon-thread"])
def test_detects_leaked_thread(daemon: bool) -> None:
    stop = threading.Event()
    before = take_snapshot()
    thread = threading.Thread(target=stop.wait, name="deliberately-leaked", daemon=daemon)
    thread.start()
    try:
        after = take_snapshot()
        problems = find_leaks(before, after)
        assert any("deliberately-leaked" in p for p in problems), problems
        with pytest.raises(LeakError, match="deliberately-leaked"):
            check_no_leaks(before, after)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    check_no_leaks(before, take_snapshot())


def test_grace_period_lets_a_finishing_thread_end() -> None:
    before = take_snapshot()
    thread = threading.Thread(target=threading.Event().wait, args=(0.2,), name="finishing")
    thread.start()
    after = wait_for_no_leaks(before, timeout=5.0)
    check_no_leaks(before, after)
    thread.join(timeout=5)


def test_ignores_idle_trio_cache_thread_name() -> None:
    stop = threading.Event()
    before = take_snapshot()
    thread = threading.Thread(target=stop.wait, name="Trio thread 12345", daemon=True)
    thread.start()
    try:
        assert find_leaks(before, take_snapshot()) == []
        # a trio worker busy with a job carries the job's name and is reported
        thread.name = "blocking_call from <task>"
        assert find_leaks(before, take_snapshot()) != []
    finally:
        stop.set()
        thread.join(timeout=5)


def test_detects_leaked_child_process() -> None:
    before = take_snapshot()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        problems = find_leaks(before, take_snapshot())
        assert any(f"pid={child.pid}" in p for p in problems), problems
        with pytest.raises(LeakError, match="child process"):
            check_no_leaks(before, take_snapshot())
    finally:
        child.kill()
        child.wait(timeout=10)
    check_no_leaks(before, wait_for_no_leaks(before, timeout=5.0))


def test_still_running_lists_live_processes_and_tolerates_gone_and_zombie_ones() -> None:
    def spawn(code: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)

    live, zombie, gone = spawn("import time; time.sleep(60)"), spawn("pass"), spawn("pass")
    try:
        gone.wait(timeout=30)
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        assert psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE
        assert _leaks.still_running([gone.pid, zombie.pid, live.pid], 0.5) == [live.pid]
    finally:
        live.kill()
        for p in (live, zombie):
            p.wait(timeout=10)
    assert _leaks.still_running([live.pid], 5.0) == []


def test_a_child_that_was_there_before_is_not_new_when_the_boot_time_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    # Linux recomputes /proc/stat's boot time from the wall clock: a slewed clock moves it by a
    # second now and then. psutil's create_time() moves with it; the leak checks' keys must not,
    # or a fork server that was there before looks new (and `run_script` killed it once).
    from psutil import _pslinux

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        before, listed = take_snapshot(), _leaks._descendants()
        booted = _pslinux.boot_time()
        monkeypatch.setattr(_pslinux, "boot_time", lambda: booted + 1.0)
        assert find_leaks(before, take_snapshot()) == []
        assert set(_leaks._descendants()) == set(listed)
        assert any(pid == child.pid for pid, _ in listed)
    finally:
        child.communicate(timeout=10)  # closes its stdin: it ends


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_detects_leaked_shm_entry() -> None:
    before = take_snapshot()
    fd, path = tempfile.mkstemp(prefix="aiocollect-leak-test-", dir="/dev/shm")
    os.close(fd)
    try:
        problems = find_leaks(before, take_snapshot())
        assert any(os.path.basename(path) in p for p in problems), problems
    finally:
        os.unlink(path)
    check_no_leaks(before, take_snapshot())


# A process holding a socket in its multiprocessing temp dir, as a fork server's parent does.
MP_TEMP_DIR_HOLDER = """
import sys
from multiprocessing.connection import Listener
listener = Listener(family="AF_UNIX")  # its address is in multiprocessing's temp dir
print(listener.address, flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(not os.path.exists("/proc/net/unix"), reason="no procfs")
def test_detects_the_temp_dir_a_killed_process_left_and_not_a_live_ones() -> None:
    before = take_snapshot()
    argv = [sys.executable, "-c", MP_TEMP_DIR_HOLDER]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        temp_dir = os.path.dirname(child.stdout.readline().strip())
        try:
            assert os.path.basename(temp_dir).startswith("pymp-")
            live = find_leaks(before, replace(take_snapshot(), children={}))
            assert not any("temp dir" in p for p in live), live  # its socket is still bound: in use
            child.kill()
            child.wait(timeout=10)
            problems = find_leaks(before, take_snapshot())
            assert any(temp_dir in p and "temp dir" in p for p in problems), problems
        finally:
            child.kill()
            child.wait(timeout=10)
            shutil.rmtree(temp_dir, ignore_errors=True)
    check_no_leaks(before, take_snapshot())


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no procfs")
def test_detects_leaked_fds_beyond_slack() -> None:
    before = take_snapshot()
    pipes = [os.pipe() for _ in range(3)]  # 6 fds, slack is 3
    try:
        problems = find_leaks(before, take_snapshot())
        assert any("file descriptors" in p for p in problems), problems
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)
    check_no_leaks(before, take_snapshot())


def test_fixture_fails_a_test_that_leaks(tmp_path: Path) -> None:
    """End to end: the real conftest turns a leaked thread and child into test errors."""
    for name in ("conftest.py", "_leaks.py"):
        shutil.copy(HERE / name, tmp_path / name)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent(
            """
            import atexit
            import subprocess
            import sys
            import threading

            def test_clean():
                pass

            def test_leaks_thread():
                stop = threading.Event()
                atexit.register(stop.set)
                threading.Thread(target=stop.wait, name="inner-leak", daemon=True).start()

            def test_leaks_child():
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                atexit.register(child.wait)
                atexit.register(child.kill)
            """
        )
    )
    env = dict(os.environ, AIOCOLLECT_TEST_LEAK_TIMEOUT="0.5")
    env.pop("PYTEST_ADDOPTS", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "3 passed, 2 errors" in out, out  # the leaks error at teardown
    assert "leaked daemon thread 'inner-leak'" in out, out
    assert "leaked child process" in out, out


# --- another program on the machine using multiprocessing (the leak check must not blame the test) ---

#: An unrelated program: it keeps creating multiprocessing locks and semaphores (``sem.mp-*`` in
#: /dev/shm, as with any non-fork start method) and shared memory (``psm_*``), holding each set
#: for a few cycles (as a program holds its locks a while) before it releases it.
#: ``python prog.py LOG [START_METHOD]``; LOG gets ``tracker PID``, then ``cycle N: NAME...``
#: once the /dev/shm entries NAME of cycle N exist, then ``stopped``. SIGTERM or SIGINT stops it.
FOREIGN_PROGRAM = """\
import collections
import multiprocessing as mp
import os
import signal
import sys
import threading
from multiprocessing import resource_tracker, shared_memory


def make(ctx):
    lock, sem = ctx.Lock(), ctx.Semaphore(2)
    shm = shared_memory.SharedMemory(create=True, size=4096)
    names = ["sem." + lock._semlock.name.lstrip("/"), "sem." + sem._semlock.name.lstrip("/"), shm._name.lstrip("/")]
    return [lock, sem, shm], names


def release(objs):
    lock, sem, shm = objs
    with lock, sem:
        shm.buf[0] += 1
    shm.close()
    shm.unlink()  # the semaphores are unlinked when their last reference goes


def main():
    ctx = mp.get_context(sys.argv[2] if len(sys.argv) > 2 else "spawn")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with open(sys.argv[1], "a", buffering=1) as log:
        objs, names = make(ctx)
        held = collections.deque([objs])
        log.write(f"tracker {resource_tracker._resource_tracker._pid}\\n")
        cycle = 0
        while True:
            log.write(f"cycle {cycle}: {' '.join(names)}\\n")
            if stop.wait(0.01):
                break
            objs, names = make(ctx)
            held.append(objs)
            # each cycle's entries live for several cycles, and the latest are always there
            if len(held) > 8:
                release(held.popleft())
            cycle += 1
        while held:
            release(held.popleft())
        objs = None
        # reap the resource tracker instead of leaving it orphaned: it exits on EOF
        tracker = resource_tracker._resource_tracker
        os.close(tracker._fd)
        os.waitpid(tracker._pid, 0)
        log.write("stopped\\n")


main()
"""

#: Started by a short-lived launcher in its own session: when the launcher exits the program
#: is re-parented to init (or a subreaper above this process), out of this process's tree.
_LAUNCHER = """\
import subprocess, sys
err = open(sys.argv[1], "w")
p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True)
print(p.pid)
"""


def _wait_exited(pidfd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)  # readable once the process has exited
    return bool(poller.poll(timeout * 1000))


class ForeignProgram:
    """A running `FOREIGN_PROGRAM`, outside this process's tree."""

    def __init__(self, workdir: Path) -> None:
        self.log = workdir / "foreign.log"
        self.stderr = workdir / "foreign.err"
        script = workdir / "foreign_program.py"
        script.write_text(FOREIGN_PROGRAM)
        launcher = subprocess.run(
            [sys.executable, "-c", _LAUNCHER, str(self.stderr), sys.executable, str(script), str(self.log)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            start_new_session=True,
        )
        assert launcher.returncode == 0, launcher.stderr
        self.pid = int(launcher.stdout)
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            pytest.fail(f"the foreign program exited at once: {self.stderr.read_text()}")
        self.tracker_pidfd: int | None = None

    def lines(self) -> list[str]:
        try:
            return self.log.read_text().splitlines()
        except FileNotFoundError:
            return []

    def cycles(self) -> dict[int, list[str]]:
        out = {}
        for line in self.lines():
            m = re.fullmatch(r"cycle (\d+): (.*)", line)
            if m:
                out[int(m.group(1))] = m.group(2).split()
        return out

    def names(self) -> set[str]:
        """Every /dev/shm entry the program has made so far."""
        return {name for names in self.cycles().values() for name in names}

    def latest_cycle(self) -> int:
        return max(self.cycles(), default=-1)

    def wait_for_cycle_after(self, cycle: int, timeout: float = 30.0) -> int:
        """Wait until the program has logged a cycle later than ``cycle``; return it."""
        deadline = time.monotonic() + timeout
        while (latest := self.latest_cycle()) <= cycle:
            if _wait_exited(self.pidfd, 0.005):
                pytest.fail(f"the foreign program exited: {self.stderr.read_text()}")
            assert time.monotonic() < deadline, f"the foreign program logged no new cycle: {self.lines()[-3:]}"
        return latest

    def stop(self) -> None:
        """Stop it and wait until it and its resource tracker have exited; raise if either had to be killed."""
        tracker = next((int(line.split()[1]) for line in self.lines() if line.startswith("tracker ")), None)
        if tracker is not None:
            try:
                self.tracker_pidfd = os.pidfd_open(tracker)
            except ProcessLookupError:
                pass  # already exited, and reaped by the program
        os.kill(self.pid, signal.SIGTERM)
        killed = []
        for name, pidfd, pid in (("program", self.pidfd, self.pid), ("tracker", self.tracker_pidfd, tracker)):
            if pidfd is None:
                continue
            if not _wait_exited(pidfd, 30):
                os.kill(pid, signal.SIGKILL)
                killed.append(name)
                assert _wait_exited(pidfd, 30), f"the foreign {name} (pid {pid}) survived SIGKILL"
            os.close(pidfd)
        assert not killed, f"the foreign program had to be killed: {killed}; {self.stderr.read_text()}"
        assert self.lines()[-1:] == ["stopped"], self.lines()[-3:]


@pytest.fixture(scope="module")
def foreign_program(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForeignProgram]:
    """An unrelated multiprocessing program running beside the module's tests, not in their tree."""
    if not hasattr(os, "pidfd_open") or not os.path.isdir("/dev/shm"):
        pytest.skip("needs Linux (pidfd_open, /dev/shm)")
    program = ForeignProgram(tmp_path_factory.mktemp("foreign"))
    try:
        # precondition of every test below: e.g. a subreaper left set here would adopt it
        assert program.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
        program.wait_for_cycle_after(-1)  # its entries are in /dev/shm
        yield program
    finally:
        try:
            program.stop()
        finally:
            left = program.names() & set(os.listdir("/dev/shm"))
            for name in left:
                os.unlink(os.path.join("/dev/shm", name))
        assert not left, f"the foreign program left /dev/shm entries: {left}"
        try:  # gone, or a zombie of an init that does not reap (nothing left but its pid)
            assert psutil.Process(program.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            pass


#: A child of the test that makes a shared memory block and leaves it in /dev/shm (it takes it
#: off its resource tracker, which would unlink it); with "hold", it keeps it mapped until EOF.
_LEAVE_SHM = """\
import sys
from multiprocessing import resource_tracker, shared_memory
shm = shared_memory.SharedMemory(create=True, size=64)
resource_tracker.unregister(shm._name, "shared_memory")
print(shm.name, flush=True)
if sys.argv[1] == "hold":
    sys.stdin.read()
shm.close()
"""


_OWN_WORK = """\
import multiprocessing
from multiprocessing import shared_memory

lock = multiprocessing.get_context("spawn").Lock()
with lock:
    shm = shared_memory.SharedMemory(create=True, size=64)
    shm.close()
    shm.unlink()
"""


def _own_multiprocessing_work() -> None:
    """What a test does with multiprocessing, cleaning up after itself: here and in a child."""
    exec(_OWN_WORK, {})  # the very code the child runs
    subprocess.run([sys.executable, "-c", _OWN_WORK], stdin=subprocess.DEVNULL, check=True, timeout=30)


@pytest.mark.timeout(120)
def test_unrelated_multiprocessing_program_is_not_a_leak(foreign_program: ForeignProgram) -> None:
    """The reported situation: another program's ``sem.mp-*``/``psm_*`` entries come and go during the test."""
    before = take_snapshot()
    start = foreign_program.latest_cycle()
    _own_multiprocessing_work()
    deadline = time.monotonic() + 60
    while True:
        # a whole cycle made after `before`: from now on some entry of a later cycle is in /dev/shm
        start = foreign_program.wait_for_cycle_after(start)
        after = wait_for_no_leaks(before, timeout=5.0)
        assert find_leaks(before, after) == []
        # The old check (every new /dev/shm entry is a leak) would have failed here. Entries that
        # are still there were judged while they existed: cleared as the program's, not as gone.
        if (after.shm - before.shm) & foreign_program.names() & set(os.listdir("/dev/shm")):
            break
        assert time.monotonic() < deadline, "the foreign program's entries never showed between the snapshots"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("child", ["exited", "hold"], ids=["left-by-exited-child", "held-by-live-child"])
def test_entry_left_by_a_child_is_reported_beside_the_program(foreign_program: ForeignProgram, child: str) -> None:
    """Positive control: the program beside does not hide an entry the test's own child leaves behind."""
    before = take_snapshot()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LEAVE_SHM, child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    name = None
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith("psm_"), name
        if child == "exited":
            assert proc.wait(timeout=30) == 0
        start = foreign_program.latest_cycle()
        foreign_program.wait_for_cycle_after(start)
        problems = find_leaks(before, wait_for_no_leaks(before, timeout=0.5))
        assert f"leaked /dev/shm entry {name!r}" in problems, problems
        assert not [p for p in problems if any(n in p for n in foreign_program.names())], problems
    finally:
        proc.stdin.close()
        proc.stdout.close()
        proc.wait(timeout=30)
        if name:
            os.unlink(os.path.join("/dev/shm", name))
    check_no_leaks(before, wait_for_no_leaks(before, timeout=5.0))


@pytest.mark.parametrize("owner", ["program", "test"])
def test_entry_named_after_a_pid(foreign_program: ForeignProgram, owner: str) -> None:
    """A name that embeds its creator's pid (torch's ``torch_<pid>_...``) decides, even when nobody holds it."""
    pid = foreign_program.pid if owner == "program" else os.getpid()
    before = take_snapshot()
    fd, path = tempfile.mkstemp(prefix=f"torch_{pid}_", dir="/dev/shm")
    os.close(fd)
    try:
        problems = find_leaks(before, take_snapshot())
        if owner == "program":
            assert problems == []
        else:
            assert problems == [f"leaked /dev/shm entry {os.path.basename(path)!r}"]
    finally:
        os.unlink(path)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_entry_of_another_user_is_not_the_tests() -> None:
    before = take_snapshot()
    fd, path = tempfile.mkstemp(prefix="aiocollect-leak-test-", dir="/dev/shm")
    os.close(fd)
    try:
        assert find_leaks(before, take_snapshot()) != []  # unheld and unnamed: the test's
        os.chown(path, 65534, 65534)
        assert find_leaks(before, take_snapshot()) == []
    finally:
        os.unlink(path)


@pytest.mark.timeout(120)
def test_suite_passes_beside_an_unrelated_program(foreign_program: ForeignProgram, tmp_path: Path) -> None:
    """End to end, as reported: the real conftest, a multiprocessing program running beside the suite."""
    for name in ("conftest.py", "_leaks.py"):
        shutil.copy(HERE / name, tmp_path / name)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent(
            """
            import atexit
            import os
            import re
            import subprocess
            import sys
            import threading
            import time

            LOG = os.environ["FOREIGN_PROGRAM_LOG"]
            LEAVE_SHM = os.environ["LEAVE_SHM"]
            OWN_WORK = os.environ["OWN_WORK"]

            def cycles():
                with open(LOG) as f:
                    return sum(1 for line in f if line.startswith("cycle "))

            def wait_for_the_program():
                # the program makes and releases entries while this test runs
                seen, deadline, pause = cycles(), time.monotonic() + 30, threading.Event()
                while cycles() <= seen:
                    assert time.monotonic() < deadline
                    pause.wait(0.005)

            def test_own_multiprocessing_work():
                exec(OWN_WORK, {})
                subprocess.run([sys.executable, "-c", OWN_WORK], check=True, timeout=30)
                wait_for_the_program()

            def test_nothing():
                wait_for_the_program()

            def test_leaks_shm_from_child():
                out = subprocess.run([sys.executable, "-c", LEAVE_SHM, "exited"], check=True, timeout=30,
                                     capture_output=True, text=True).stdout
                atexit.register(os.unlink, "/dev/shm/" + out.strip())
                print("LEFT", out.strip())
                wait_for_the_program()
            """
        )
    )
    env = dict(
        os.environ,
        AIOCOLLECT_TEST_LEAK_TIMEOUT="1",
        FOREIGN_PROGRAM_LOG=str(foreign_program.log),
        LEAVE_SHM=_LEAVE_SHM,
        OWN_WORK=_OWN_WORK,
    )
    env.pop("PYTEST_ADDOPTS", None)
    start = foreign_program.latest_cycle()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = result.stdout + result.stderr
    made = {n for c, names in foreign_program.cycles().items() if c > start for n in names}
    assert made, "the foreign program made no entries while the inner suite ran"
    assert "3 passed, 1 error" in out, out  # the leak errors at teardown
    (left,) = set(re.findall(r"LEFT (\S+)", out))  # -rA shows the output twice
    assert f"leaked /dev/shm entry {left!r}" in out, out
    assert not [n for n in made if n in out], out
    assert result.returncode == 1, out

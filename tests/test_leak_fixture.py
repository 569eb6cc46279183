"""Self-tests for the leak checks behind the autouse ``no_leaks`` fixture."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

try:  # works whether or not tests/ is a package
    from ._leaks import LeakError, check_no_leaks, find_leaks, take_snapshot, wait_for_no_leaks
except ImportError:
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

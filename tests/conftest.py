"""Shared pytest configuration for the aiocollect test suite.

* ``anyio_backend``: async tests are written for the anyio pytest plugin
  (``@pytest.mark.anyio``). They run under plain asyncio by default; a test (or class,
  or module via ``pytestmark``) marked ``@pytest.mark.all_backends`` runs under asyncio,
  asyncio with uvloop, and trio.
* ``no_leaks``: autouse; fails a test that leaves behind a thread, a child process, a
  ``/dev/shm`` entry or more than a few file descriptors (see ``tests/_leaks.py``). Only
  what the test's own process tree made counts: another program using multiprocessing on
  the same machine does not fail the suite.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator

import pytest

try:  # works whether or not tests/ is a package
    from ._leaks import find_leaks, take_snapshot, wait_for_no_leaks
except ImportError:
    from _leaks import find_leaks, take_snapshot, wait_for_no_leaks

_HAVE_UVLOOP = sys.platform != "win32" and importlib.util.find_spec("uvloop") is not None
_HAVE_TRIO = importlib.util.find_spec("trio") is not None

DEFAULT_BACKEND = pytest.param(("asyncio", {}), id="asyncio")
ALL_BACKENDS = [
    DEFAULT_BACKEND,
    pytest.param(
        ("asyncio", {"use_uvloop": True}),
        id="uvloop",
        marks=pytest.mark.skipif(not _HAVE_UVLOOP, reason="uvloop is not installed"),
    ),
    pytest.param(
        "trio",
        id="trio",
        marks=pytest.mark.skipif(not _HAVE_TRIO, reason="trio is not installed"),
    ),
]


def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject.toml; repeated here so the markers exist even when
    # pytest is pointed at this directory with another config file.
    config.addinivalue_line("markers", "slow: long-running test")
    config.addinivalue_line("markers", "cuda: needs a CUDA device")
    config.addinivalue_line(
        "markers",
        "all_backends: run an anyio test under asyncio, asyncio+uvloop and trio",
    )
    _give_ctrl_c_back()


def _give_ctrl_c_back() -> None:
    """Start the suite with Ctrl-C as a terminal user has it, whatever the runner handed us.

    A job started in the background by a non-interactive shell (``cmd &`` in a CI script)
    inherits SIGINT *ignored*, and Python then keeps it ignored instead of installing its
    KeyboardInterrupt handler; every process the suite spawns inherits that too. The Ctrl-C
    tests would then wait for an interrupt that can never arrive. A handled signal is reset
    to its default at exec, so installing Python's handler here also gives it back to the
    scripts and workers the tests start.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def _parametrizes(metafunc: pytest.Metafunc, argname: str) -> bool:
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if argname in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The anyio plugin adds ``anyio_backend`` to every test marked ``anyio``; a test
    # that parametrizes it explicitly keeps its own parameters.
    if "anyio_backend" not in metafunc.fixturenames or _parametrizes(metafunc, "anyio_backend"):
        return
    if metafunc.definition.get_closest_marker("all_backends") is not None:
        params = ALL_BACKENDS
    else:
        params = [DEFAULT_BACKEND]
    # Module scope, like the anyio plugin's own fixture, so module-scoped async
    # fixtures keep working.
    metafunc.parametrize("anyio_backend", params, indirect=True, scope="module")


@pytest.fixture(scope="module")
def anyio_backend(request: pytest.FixtureRequest) -> object:
    """The anyio backend (name, or ``(name, options)``) of the running test."""
    return getattr(request, "param", ("asyncio", {}))


#: Grace period for threads and child processes to finish after a test (seconds).
LEAK_TIMEOUT = float(os.environ.get("AIOCOLLECT_TEST_LEAK_TIMEOUT", "5"))


def _create_cuda_context(request: pytest.FixtureRequest) -> None:
    """Create this process's CUDA context before a CUDA test's leak snapshot, once.

    The driver opens its device files (about 20 fds) when a process first uses the GPU and
    keeps them until it exits; whichever CUDA test came first was charged with them (seen on
    an H200). Pinned host memory and a matrix product bring up the rest of what a test uses.
    """
    if request.node.get_closest_marker("cuda") is None:
        return
    import torch

    if torch.cuda.is_available() and not getattr(_create_cuda_context, "done", False):
        x = torch.ones(8, 8, device="cuda")
        (x @ x).sum().item()
        torch.empty(8, pin_memory=True).copy_(x[0], non_blocking=True)
        torch.cuda.synchronize()
        _create_cuda_context.done = True  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if it leaves threads, child processes, /dev/shm entries or fds behind.

    Threads and child processes get up to ``LEAK_TIMEOUT`` (5 s) after the test to finish
    on their own; whatever is still there then is reported as an error at teardown. A new
    /dev/shm entry counts only if it is attributable to the test's process tree (the rule is
    in ``tests/_leaks.py``); `find_leaks` reuses the verdicts the wait made on ``after``.
    """
    _create_cuda_context(request)
    before = take_snapshot()
    yield
    after = wait_for_no_leaks(before, timeout=LEAK_TIMEOUT)
    problems = find_leaks(before, after)
    if problems:
        pytest.fail("resources leaked by the test:\n  " + "\n  ".join(problems), pytrace=False)


def _sigint_state() -> tuple[object, bool, int]:
    import signal

    wakeup_fd = signal.set_wakeup_fd(-1)  # reading it means setting it: put it back at once
    if wakeup_fd != -1:
        signal.set_wakeup_fd(wakeup_fd)
    return signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []), wakeup_fd


@pytest.fixture(autouse=True)
def gc_not_left_frozen() -> Iterator[None]:
    """Fail a test that leaves objects frozen out of the cyclic GC (an unclosed large AsyncEnvPool)."""
    import gc

    from aiocollect._envs._gcfreeze import _INTERPRETER_FROZEN

    before = gc.get_freeze_count()
    yield
    after = gc.get_freeze_count()
    # Python 3.12's collector moves the immortal objects it meets (375 tuples on 3.12.1) into
    # the permanent generation, so the count also moves by itself up to that many.
    if after > max(before, _INTERPRETER_FROZEN):
        gc.unfreeze()
        pytest.fail(f"gc.get_freeze_count() went from {before} to {after}: something froze the GC and did not undo it",
                    pytrace=False)  # fmt: skip


@pytest.fixture(autouse=True)
def sigint_untouched() -> Iterator[None]:
    """Fail a test that leaves the main thread's SIGINT handler, mask or wake-up fd changed.

    A blocked or ignored SIGINT is inherited by every process started afterwards, and makes
    every later Ctrl-C test hang rather than fail where the change was made.
    """
    before = _sigint_state()
    yield
    after = _sigint_state()
    if after != before:
        pytest.fail(f"SIGINT (handler, blocked, wake-up fd) changed by the test: {before} -> {after}", pytrace=False)

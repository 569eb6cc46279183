"""The blocking portal's call path: one thread hand-off each way, cancellable, never left waiting."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextvars import copy_context
from typing import Any

import anyio
import pytest

from aiocollect._core._portal import Portal, _Launcher

WAIT = 10.0  # seconds: a bound for the waits below, never reached when the code is right


def _block_loop(portal: Portal) -> tuple[threading.Event, threading.Thread]:
    """Make the portal's loop thread busy (a plain function call) until ``release`` is set."""
    entered, release = threading.Event(), threading.Event()

    def busy() -> None:  # runs in the loop's own thread: the loop runs nothing else meanwhile
        entered.set()
        assert release.wait(WAIT)

    caller = threading.Thread(target=portal.call, args=(busy,))
    caller.start()
    assert entered.wait(WAIT)
    return release, caller


def test_a_call_is_queued_without_waiting_for_the_loop() -> None:
    # anyio's start_task_soon waits for the loop to spawn the task: a second thread round
    # trip per call. Starting a call must return even while the loop is busy.
    portal = Portal("B", "A")
    release, caller = _block_loop(portal)
    try:
        started: list[Future[Any]] = []

        async def answer() -> int:
            return 42

        starter = threading.Thread(target=lambda: started.append(portal._get().start(answer)))
        starter.start()
        starter.join(WAIT)
        assert not starter.is_alive(), "start() waited for the busy loop"
        (future,) = started
        assert not future.done()
    finally:
        release.set()
        caller.join(WAIT)
    assert future.result(WAIT) == 42
    portal.stop()


def test_cancelling_the_future_cancels_the_call_in_the_loop() -> None:
    portal = Portal("B", "A")
    running, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        try:
            running.set()
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    future = portal._get().start(forever)
    assert running.wait(WAIT)
    assert future.cancel()  # pending until the call ends, so the caller can still cancel it
    assert cancelled.wait(WAIT)
    portal.stop()


def test_errors_reach_the_caller_with_their_type() -> None:
    portal = Portal("B", "A")

    async def fail() -> None:
        raise ValueError("from the loop")

    with pytest.raises(ValueError, match="from the loop"):
        portal.call(fail)
    assert portal.call(lambda: 7) == 7  # and the portal goes on serving
    portal.stop()


def test_a_call_queued_as_the_portal_stops_runs_before_it_ends() -> None:
    portal = Portal("B", "A")
    launcher = portal._get()
    release, caller = _block_loop(portal)
    done = threading.Event()

    async def late() -> str:
        done.set()
        return "ran"

    future = launcher.start(late)  # queued behind the busy call
    stopper = threading.Thread(target=portal.stop)
    stopper.start()  # its own request queues behind ours
    release.set()
    caller.join(WAIT)
    stopper.join(WAIT)
    assert not stopper.is_alive()
    assert future.result(WAIT) == "ran" and done.is_set()
    with pytest.raises(RuntimeError, match="has stopped"):
        launcher.start(late)


def test_calls_the_loop_never_spawns_fail_instead_of_waiting_forever() -> None:
    # A loop that ends drops the callbacks still queued for it: their callers must not hang.
    callbacks: list[Callable[[], Any]] = []

    async def never() -> None:
        raise AssertionError("must not run")

    async def launcher_for_an_ended_group() -> _Launcher:
        async with anyio.create_task_group() as tg:
            launcher = _Launcher(callbacks.append, tg, copy_context())
            late = launcher.start(never)
        callbacks.pop()()  # the spawn runs after the group has ended: the call fails
        with pytest.raises(RuntimeError, match="has stopped"):
            late.result(WAIT)
        return launcher

    launcher = anyio.run(launcher_for_an_ended_group)
    dropped = launcher.start(never)
    launcher.close()  # the loop ended with that spawn unrun
    with pytest.raises(RuntimeError, match="has stopped"):
        dropped.result(WAIT)
    with pytest.raises(RuntimeError, match="has stopped"):
        launcher.start(never)
    callbacks.pop()()  # a spawn run after all (during the loop's shutdown) changes nothing
    assert isinstance(dropped.exception(), RuntimeError)


def test_a_portal_stopped_for_good_does_not_start_again() -> None:
    portal = Portal("B", "A")
    assert portal.call(lambda: 1) == 1
    portal.stop()
    assert portal.call(lambda: 2) == 2  # a plain stop: the next call starts a new loop
    portal.stop(final=True)
    threads = set(threading.enumerate())
    with pytest.raises(RuntimeError, match="stopped for good"):
        portal.call(lambda: 3)
    assert not portal.running and set(threading.enumerate()) <= threads

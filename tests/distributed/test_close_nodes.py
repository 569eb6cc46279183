"""Closing a `DistributedTransport`'s nodes from one task: the wait for their processes to end.

The close itself (every node stopped, failures kept, stuck nodes killed, nothing left
running) is covered end to end by `test_distributed.py`; these check the one wait that
replaced a waiting task per node.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from aiocollect._workers._distributed_close import _wait_ended

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def pipes() -> Iterator[Callable[[], tuple[int, int]]]:
    made: list[int] = []

    def make() -> tuple[int, int]:
        r, w = os.pipe()
        made.extend((r, w))
        return r, w

    yield make
    for fd in made:
        os.close(fd)


def run_in_thread(fn: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_returns_once_every_descriptor_is_readable_without_waiting_for_deadlines(pipes) -> None:
    (r1, w1), (r2, w2) = pipes(), pipes()
    far = time.monotonic() + 300
    os.write(w1, b"x")
    os.write(w2, b"x")
    waiter = run_in_thread(lambda: _wait_ended({r1: far, r2: far}))
    waiter.join(30)
    assert not waiter.is_alive(), "both were readable: it should have returned, long before their deadlines"


def test_a_descriptor_past_its_deadline_is_given_up_and_the_others_still_waited_for(pipes) -> None:
    (never, _), (later, w) = pipes(), pipes()
    now = time.monotonic()
    waiter = run_in_thread(lambda: _wait_ended({never: now + 0.1, later: now + 300}))
    assert waiter.is_alive(), "nothing is readable yet and `later` has time left"
    os.write(w, b"x")
    waiter.join(30)
    assert not waiter.is_alive(), "`never` is given up at its deadline, and `later` is now readable"


def test_a_process_sentinel_is_readable_once_the_process_has_ended() -> None:
    ctx = multiprocessing.get_context("forkserver")
    go = ctx.Event()
    p = ctx.Process(target=go.wait, daemon=True)
    p.start()
    try:
        waiter = run_in_thread(lambda: _wait_ended({p.sentinel: time.monotonic() + 300}))
        assert waiter.is_alive() and p.exitcode is None, "the process runs until it is told to end"
        go.set()
        waiter.join(30)
        assert not waiter.is_alive(), "the process ended: its sentinel should have been seen"
        p.join(5)
        assert p.exitcode == 0
    finally:
        if p.is_alive():
            p.kill()
        p.join(5)
        p.close()

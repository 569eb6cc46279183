"""`Notifier`: a change that concerns one key wakes only that key's waiters and the waiters on any change.

The transports wait per node while nodes start and stop; if each node's event woke every
node's waiter, N nodes would cost N² wake-ups. Each test counts how often the predicates are
evaluated: once on entry, then once per wake-up.
"""

from __future__ import annotations

import threading

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from aiocollect._core._notify import Notifier

pytestmark = [pytest.mark.anyio, pytest.mark.all_backends, pytest.mark.timeout(30)]


class Flag:
    """A predicate that counts its evaluations."""

    def __init__(self) -> None:
        self.value = False
        self.checks = 0

    def __call__(self) -> bool:
        self.checks += 1
        return self.value


async def _wait(n: Notifier, flag: Flag, key: object, done: anyio.Event) -> None:
    await n.wait_until(flag, key=key)
    done.set()


async def test_a_change_for_one_key_wakes_only_its_waiters_and_those_on_any_change() -> None:
    n = Notifier()
    flags = {key: Flag() for key in (0, 1, 2, None)}
    done = {key: anyio.Event() for key in flags}
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for key, flag in flags.items():
                tg.start_soon(_wait, n, flag, key, done[key])
            await wait_all_tasks_blocked()
            assert {k: f.checks for k, f in flags.items()} == {0: 1, 1: 1, 2: 1, None: 1}

            for _ in range(5):
                n.notify(1)
                await wait_all_tasks_blocked()
            # Node 1's waiter and the waiter on any change re-checked five times; 0 and 2 never.
            assert {k: f.checks for k, f in flags.items()} == {0: 1, 1: 6, 2: 1, None: 6}

            flags[1].value = True
            n.notify(1)
            await done[1].wait()
            await wait_all_tasks_blocked()
            assert {k: f.checks for k, f in flags.items()} == {0: 1, 1: 7, 2: 1, None: 7}

            for flag in flags.values():
                flag.value = True
            n.notify_all()  # every waiter, keyed or not
            for event in done.values():
                await event.wait()
    assert {k: f.checks for k, f in flags.items()} == {0: 2, 1: 7, 2: 2, None: 8}
    assert n._waiters == {}


async def test_a_change_made_in_another_thread_wakes_a_keyed_waiter() -> None:
    n = Notifier()
    flag = Flag()
    done = anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_wait, n, flag, "node", done)
            await wait_all_tasks_blocked()

            def change() -> None:
                with n.lock:
                    flag.value = True
                n.notify("node")

            thread = threading.Thread(target=change)
            thread.start()
            await done.wait()
            thread.join()
    assert flag.checks == 2


async def test_a_cancelled_keyed_wait_leaves_no_waiter_behind() -> None:
    n = Notifier()
    flag = Flag()
    with anyio.move_on_after(0.05) as scope:
        await n.wait_until(flag, key=3)
    assert scope.cancelled_caught
    assert n._waiters == {}
    n.notify(3)  # nobody left to wake: a no-op
    assert flag.checks == 1

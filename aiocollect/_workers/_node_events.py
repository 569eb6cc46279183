"""Handing out the events of nodes the trainer talks to over a connection (distributed, Ray, RPC).

A node's reader queues its events; the engine takes them. A lost connection is queued as
``Exited(None)``: the node's exit code is not known yet. It is held back, and whatever the
node queued after it, until the code is learnt (off the loop: it may take a moment), so a
SIGKILLed node is reported as killed, never as "exited with code None" by whichever read
came first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

from .._core._notify import Notifier
from ._messages import Event, Exited

__all__ = ["receive_events", "take_events"]

#: ``w -> (known, code)``: a lost node's exit code if it can be told now.
CodeNow = Callable[[int], "tuple[bool, int | None]"]


def take_events(
    notifier: Notifier, queue: Callable[[int], deque[Event]], workers: list[int], code_now: CodeNow
) -> list[tuple[int, Event]]:
    """Every queued event of ``workers``, up to a lost node whose exit code is not known yet."""
    got = []
    with notifier.lock:
        for w in workers:
            events = queue(w)
            while events:
                event = events[0]
                if isinstance(event, Exited) and event.exitcode is None:
                    known, code = code_now(w)
                    if not known:
                        break
                    event = Exited(code)
                events.popleft()
                got.append((w, event))
    return got


async def receive_events(
    notifier: Notifier,
    queue: Callable[[int], deque[Event]],
    workers: list[int],
    code_now: CodeNow,
    learn_code: Callable[[int], Awaitable[int | None]],
) -> list[tuple[int, Event]]:
    """Wait for events of ``workers``; a lost node's exit is handed out once ``learn_code`` says its code."""
    await notifier.wait_until(lambda: any(queue(w) for w in workers))
    got = take_events(notifier, queue, workers, code_now)
    if got:
        return got
    # All that is left is lost nodes whose exit codes are not in yet.
    for w in workers:
        events = queue(w)
        if events and isinstance(events[0], Exited):
            code = await learn_code(w)
            with notifier.lock:
                events.popleft()
            got.append((w, Exited(code)))
    return got

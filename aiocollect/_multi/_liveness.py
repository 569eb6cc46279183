"""Liveness of worker processes: which workers owe work and have stopped making progress.

A worker bumps a progress count in its control words at every env step and every command
it handles, and holds a busy flag while it works; its transport reads them for us. The parent never gets a message
from a worker that is stopped (``SIGSTOP``) or blocked inside its env, so it looks at those
counts instead, whenever it waits on workers (and for ``stats()``). A worker is *silent* when
it owes the parent something and its count has not moved since the parent last looked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

__all__ = ["STALL_REPORT", "Liveness", "process_state"]

STALL_REPORT = 10.0  # seconds of silence after which stats() lists a worker that owes work


#: A worker's progress count and busy flag, or None when it is not running.
Progress = tuple[int, bool] | None


class Liveness:
    """Per-worker progress clocks (not thread-safe: the collector's event loop owns it).

    Args:
        num_workers: How many workers to track.
    """

    def __init__(self, num_workers: int) -> None:
        self._seen: list[tuple[int, float]] = [(-1, 0.0)] * num_workers  # count last seen, since when
        self._sent: list[int] = [-1] * num_workers  # the count when work was last sent

    def work_sent(self, w: int, progress: Progress) -> None:
        """Worker ``w`` was just sent work: remember its count and restart its clock."""
        count = -1 if progress is None else progress[0]
        self._sent[w], self._seen[w] = count, (count, time.monotonic())

    def silent(
        self, progress: Sequence[Progress], alive: Sequence[bool], owed: Callable[[int], bool]
    ) -> list[tuple[int, float, int]]:
        """``(worker, seconds, count)`` of live workers that owe work and made no progress since last seen."""
        now, out = time.monotonic(), []
        for w, p in enumerate(progress):
            if p is None or not alive[w]:
                continue
            count, busy = p
            # The worker says it is working, or it has not even received the work last sent
            # while work is owed (a finished batch is only known once its message is read, so
            # what is owed alone would blame a worker whose batch waits unread).
            seen, since = self._seen[w]
            if count != seen or not (busy or (count == self._sent[w] and owed(w))):
                self._seen[w] = (count, now)  # progress, or idle: the clock starts again
            else:
                out.append((w, now - since, count))
        return out

    def forgive(self, w: int, count: int) -> None:
        """Restart worker ``w``'s clock without progress (it is being restarted)."""
        self._seen[w] = (count, time.monotonic())


def process_state(pid: int | None) -> str:
    """How a silent worker's process looks from outside (Linux ``/proc``), for error messages."""
    if getattr(pid, "host", None) is not None:  # a collection node's, maybe on another machine
        return "it is blocked in its env or policy, stopped, or its machine stopped answering"
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "it is stuck in its env or policy, or stopped"
    if state in ("T", "t"):
        return "its process is stopped (SIGSTOP or a debugger)"
    return "it is blocked in its env or policy (or waiting on something they wait on)"

"""An env for two nodes whose second node's close waits for the first node's process to end.

It shows that a closing collector lets a node's process go as soon as that node has stopped,
not only once every node has: the first env built (in one node process) records its pid;
the other's ``close`` waits for that process to end, up to ``wait`` seconds, and writes what
it saw to ``outcome``. The wait is a pidfd (readable once the process has ended, reaped or
not), not a poll. Files work across node processes.
"""

from __future__ import annotations

import os
import select
from pathlib import Path

from aiocollect.testing import CountingEnv

__all__ = ["ClosesAfterTheFirstNodeExits", "outcome"]


class ClosesAfterTheFirstNodeExits(CountingEnv):
    """A `CountingEnv`; see the module docstring."""

    def __init__(self, directory: str, trainer_pid: int, wait: float) -> None:
        super().__init__(1, episode_length=7)
        self.directory, self.wait = Path(directory), wait
        self.first = False
        if os.getpid() == trainer_pid:
            return  # not on a node
        try:
            fd = os.open(self.directory / "first", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        self.first = True

    def close(self) -> None:
        first = self.directory / "first"
        if not self.first and os.getpid() != _pid(first):
            try:
                pidfd = os.pidfd_open(_pid(first))
            except ProcessLookupError:  # ended and reaped already
                ended = True
            else:
                try:
                    ended = bool(select.select([pidfd], [], [], self.wait)[0])
                finally:
                    os.close(pidfd)
            (self.directory / "outcome").write_text("ended" if ended else "still running")
        super().close()


def _pid(path: Path) -> int:
    return int(path.read_text() or 0)


def outcome(directory: str) -> str:
    """What the second node's close saw of the first node's process (``"missing"``: it never looked)."""
    path = Path(directory) / "outcome"
    return path.read_text() if path.exists() else "missing"

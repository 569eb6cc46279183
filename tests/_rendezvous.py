"""Envs that meet at a given step, so a test can know every worker finished its first batch.

A first-come collector (``MultiAsync``, distributed ``sync=False``) delivers batches in the
order workers finish them: on a busy machine one worker may deliver every batch of a short
run before another has started. A test that checks every worker contributes makes that
certain with these envs: each env instance, at its ``at``-th step, creates a file named for
itself in ``directory`` and waits until ``group`` such files exist. With ``at`` set to the
first step of the second batch, no worker can finish a second batch before every worker has
finished its first. Finished is not delivered, though: a remote node's batch may still be in
transit. Distributed nodes collect into two slots and start a third batch only once the
trainer has taken their first, so their tests meet at the first step of the third batch.
Files work across threads, processes and Ray actors alike.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

from aiocollect.testing import CountingEnv, SleepyAsyncEnv

__all__ = ["MeetingCountingEnv", "MeetingSleepyEnv", "met"]

TIMEOUT = 60.0  # far beyond any start-up: reaching it means a worker never came


class _Meeting:
    def __init__(self, directory: str, group: int, at: int) -> None:
        self.directory, self.group, self.at, self.calls = Path(directory), group, at, 0
        self.name = f"{os.getpid()}-{uuid.uuid4().hex}"

    def arrive(self) -> bool:
        """Count a step; True at the meeting step (after creating this env's file)."""
        self.calls += 1
        if self.calls != self.at:
            return False
        (self.directory / self.name).touch()
        return True

    def complete(self) -> bool:
        return sum(1 for _ in self.directory.iterdir()) >= self.group

    def timed_out(self, started: float) -> None:
        if time.monotonic() - started > TIMEOUT:
            met = sum(1 for _ in self.directory.iterdir())
            raise RuntimeError(f"only {met} of {self.group} envs met at step {self.at}")


class MeetingCountingEnv(CountingEnv):
    """A `CountingEnv` whose ``at``-th step waits until ``group`` envs have reached theirs."""

    def __init__(self, directory: str, group: int, at: int, num_envs: int = 1, episode_length: int = 7) -> None:
        super().__init__(num_envs, episode_length=episode_length)
        self.meeting = _Meeting(directory, group, at)

    def step(self, action: Any) -> Any:
        if self.meeting.arrive():
            started = time.monotonic()
            # Other processes' files: nothing to wait on but the directory itself.
            while not self.meeting.complete():
                self.meeting.timed_out(started)
                time.sleep(0.002)
        return super().step(action)


class MeetingSleepyEnv(SleepyAsyncEnv):
    """A `SleepyAsyncEnv` whose ``at``-th step waits until ``group`` envs have reached theirs."""

    def __init__(self, directory: str, group: int, at: int, delay: float = 0.001, episode_length: int = 5) -> None:
        super().__init__(delay=delay, episode_length=episode_length)
        self.meeting = _Meeting(directory, group, at)

    async def step(self, action: Any) -> Any:
        if self.meeting.arrive():
            started = time.monotonic()
            while not self.meeting.complete():
                self.meeting.timed_out(started)
                await anyio.sleep(0.002)
        return await super().step(action)


def met(directory: str | Path) -> int:
    """How many envs reached their meeting step in ``directory``."""
    return len(os.listdir(directory))

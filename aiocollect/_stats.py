"""The frozen statistics record every collector returns from ``stats()``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CollectorStats"]


@dataclass(frozen=True)
class CollectorStats:
    """A snapshot of a collector's counters; cheap to take and safe to keep.

    Attributes:
        frames: Frames collected so far (delivered or queued).
        batches: Batches collected so far.
        total_frames: The frame budget, or ``None`` for an endless collector.
        frames_per_second: Frames divided by the time spent collecting them.
        policy_version: The current policy version (bumped by each weight update).
        completed: Whether the frame budget has been reached.
        workers: Number of worker processes (0 for in-process collectors).
        workers_alive: Workers currently running.
        restarts: Workers restarted by supervision (``restart_workers``).
        dropped_batches: In-flight batches lost with crashed workers (never delivered).

    Examples:
        >>> s = CollectorStats(frames=100, batches=1, total_frames=None, frames_per_second=1e3,
        ...                    policy_version=0, completed=False)
        >>> s.as_dict()["frames"]
        100
    """

    frames: int
    batches: int
    total_frames: int | None
    frames_per_second: float
    policy_version: int
    completed: bool
    workers: int = 0
    workers_alive: int = 0
    restarts: int = 0
    dropped_batches: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Return the record as a plain dict (for loggers)."""
        return asdict(self)

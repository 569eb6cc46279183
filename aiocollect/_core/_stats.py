"""The frozen statistics record every collector returns from ``stats()``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BufferStats", "CollectorStats"]


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
        workers_alive: Worker processes currently running (stalled ones included).
        restarts: Workers restarted by supervision (``restart_workers``).
        dropped_batches: In-flight batches lost with crashed workers (never delivered).
        stalled_workers: Ids of workers that owe work but made no progress (no env step,
            no command handled) for 10 s, or for half of ``worker_timeout`` if that is
            shorter: they are stopped or hung, and ``worker_timeout`` will act on them.
        env_errors: Env steps that raised and were recorded as truncations (an
            `AsyncEnvPool` with ``on_error="reset"``; in-process collectors).
        env_timeouts: Env steps that ran past ``step_timeout`` and were recorded as
            truncations (``on_timeout="truncate"``; in-process collectors).

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
    stalled_workers: tuple[int, ...] = ()
    env_errors: int = 0
    env_timeouts: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Return the record as a plain dict (for loggers)."""
        return asdict(self)


@dataclass(frozen=True)
class BufferStats:
    """A snapshot of a `ReplayBuffer`'s counters.

    Attributes:
        size: Frames stored and available to sample (``len(buffer)``).
        capacity: Frames the storage holds (0 until the first batch arrives).
        write_count: Frames ever committed.
        sample_count: Frames ever sampled (``batch_size`` per call, fewer where a
            ``SliceSampler(strict_length=False)`` returned fewer).
        in_flight: Frames reserved by writers and not yet committed.
        samples_per_insert: Observed ratio of sampled to inserted frames beyond ``min_size``.
        insert_wait_seconds: Total time writers waited on the rate limiter or capacity
            (only while blocked: a call that need not wait adds 0).
        sample_wait_seconds: Total time samplers waited for data or the rate limiter
            (only while blocked, as above).
        policy_version: The newest policy version the buffer knows of.
        stale_dropped: Frames removed because they were older than ``max_policy_lag``.
        sampled_policy_lag_mean: Mean policy age of sampled frames (versions behind).
        sampled_policy_lag_max: Largest policy age seen in a sample.

    Examples:
        >>> from aiocollect import ReplayBuffer
        >>> ReplayBuffer(100).stats().size
        0
    """

    size: int
    capacity: int
    write_count: int
    sample_count: int
    in_flight: int
    samples_per_insert: float
    insert_wait_seconds: float
    sample_wait_seconds: float
    policy_version: int
    stale_dropped: int
    sampled_policy_lag_mean: float
    sampled_policy_lag_max: int

    def as_dict(self) -> dict[str, Any]:
        """Return the record as a plain dict (for loggers)."""
        return asdict(self)

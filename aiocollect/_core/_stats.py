"""The statistics snapshots collectors and buffers return from ``stats()``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BufferStats", "CollectorStats"]


#: What a key that does not apply reads as through attribute access (``stats.workers`` of an
#: in-process collector is 0): the record keeps the attribute API it had as a dataclass.
_NEUTRAL: dict[str, Any] = {
    "total_frames": None,
    "workers": 0,
    "workers_alive": 0,
    "restarts": 0,
    "dropped_batches": 0,
    "stalled_workers": (),
    "env_errors": 0,
    "env_timeouts": 0,
    "policy_errors": 0,
    "policy_timeouts": 0,
}
_READ_ONLY = "CollectorStats is a read-only snapshot; copy it with dict(stats) to change it"


class CollectorStats(dict[str, Any]):
    """A snapshot of a collector's counters: a read-only dict whose keys are also attributes.

    It reads as TorchRL's ``stats()`` dict (``stats["frames"]``, ``stats.get("policy_version")``,
    ``dict(stats)``, ``json.dumps(stats)``) and as a record (``stats.frames``). It is cheap to
    take, safe to keep and never changes: a new call gives a new snapshot. A key is present
    only where it applies; attribute access to one that does not gives its neutral value
    (``stats.total_frames`` is ``None`` for an endless collector, ``stats.workers`` is 0 for an
    in-process one), and ``stats["total_frames"]`` raises ``KeyError`` there, as in TorchRL.

    Attributes:
        frames: Frames collected so far (delivered or queued).
        batches: Batches collected so far.
        total_frames: The frame budget (absent for an endless collector).
        completed: Whether the frame budget has been reached.
        requested_frames_per_batch: Frames per batch, across the env batch (and workers).
        policy_version: The current policy version (bumped by each weight update).
        frames_per_second: Frames divided by the time spent collecting them.
        workers: Number of worker processes (multi-worker collectors).
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
        policy_errors: Coroutine-policy calls that raised and ended their env's trajectory
            (`AsyncBatchedCollector` with ``on_policy_error="reset"``).
        policy_timeouts: Coroutine-policy calls past ``policy_timeout`` that ended their
            env's trajectory (``on_policy_timeout="truncate"``).

    ``stats(workers="per_worker")`` or ``"both"`` of a multi-worker collector adds
    ``"worker_<i>/<metric>"`` keys (``frames``, ``batches``, ``requested_frames_per_batch``,
    ``policy_version``, ``alive``, ``restarts`` of worker ``i``).

    Examples:
        >>> import json
        >>> s = CollectorStats(frames=100, batches=1, total_frames=None, frames_per_second=1e3,
        ...                    policy_version=0, completed=False)
        >>> s.frames, s["frames"], s.total_frames, "total_frames" in s
        (100, 100, None, False)
        >>> json.loads(json.dumps(s))["batches"]
        1
    """

    __slots__ = ()

    def __init__(self, fields: Any = (), /, **more: Any) -> None:
        """Build the snapshot from a mapping and/or keywords; entries whose value is ``None`` are left out."""
        items = {**dict(fields), **more}
        super().__init__({k: v for k, v in items.items() if v is not None})

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            if name in _NEUTRAL:
                return _NEUTRAL[name]
            raise AttributeError(f"'CollectorStats' object has no attribute {name!r}") from None

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(_READ_ONLY)

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        # The default for a dict subclass rebuilds it item by item through __setitem__.
        return (CollectorStats, (dict(self),))

    def __repr__(self) -> str:
        return f"CollectorStats({dict.__repr__(self)})"

    def as_dict(self) -> dict[str, Any]:
        """Return the snapshot as a plain (mutable) dict, for loggers."""
        return dict(self)


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

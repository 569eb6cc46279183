"""Who writes into a `ReplayBuffer`, and the account a waiter gets when no more frames will come.

Collectors register with the buffer they feed (``attach_writer``) and say how they ended
(``detach_writer``): frame budget spent, shut down, or failed. Once every registered writer
has ended, a ``sample()`` or ``wait_for()`` that the frames already stored cannot serve will
never be served: the buffer raises `BufferStarvedError` instead of waiting forever. A wait
with ``timeout=`` that runs out raises `BufferTimeoutError` with the same account.

A buffer that no collector ever registered with (the user calls ``extend`` from a task of
their own) keeps waiting: the buffer cannot know whether more frames will come.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._core._errors import BufferStarvedError

__all__ = ["WriterRecord", "Writers", "WritersMixin", "check_timeout"]


def check_timeout(timeout: object, nowait_hint: str = "") -> float | None:
    """Validate a ``timeout=`` argument: seconds (> 0) or None; ``nowait_hint`` names the no-wait call."""
    rule = f"timeout must be a positive number of seconds or None, got {timeout!r}"
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(rule)
    if not timeout > 0:
        raise ValueError(f"{rule}; call {nowait_hint} not to wait at all" if nowait_hint else rule)
    return float(timeout)


@dataclass
class WriterRecord:
    """One collector feeding the buffer; ``ending`` says how it stopped (``None``: still writing)."""

    name: str
    ending: str | None = None
    error: BaseException | None = field(default=None, repr=False)


class Writers:
    """The collectors registered with one buffer (guarded by the buffer's lock)."""

    def __init__(self) -> None:
        self.records: list[WriterRecord] = []

    def attach(self, name: str) -> WriterRecord:
        record = WriterRecord(name)
        self.records.append(record)
        return record

    @property
    def active(self) -> int:
        return sum(r.ending is None for r in self.records)

    @property
    def all_done(self) -> bool:
        """Every registered writer has ended (and at least one registered)."""
        return bool(self.records) and self.active == 0

    def cause(self) -> BaseException | None:
        """The most recent failure of a writer, if one failed."""
        failed = [r.error for r in self.records if r.error is not None]
        return failed[-1] if failed else None

    def account(self) -> str:
        """Who writes (or wrote) into the buffer, for an error message."""
        if not self.records:
            return "no collector has registered with it (pass it to a collector as replay_buffer=)"
        if self.all_done:
            endings = "; ".join(f"{r.name} {r.ending}" for r in self.records)
            return f"no collector writes into it any more ({endings})"
        running = [r.name for r in self.records if r.ending is None]
        who = "1 collector still writes" if len(running) == 1 else f"{len(running)} collectors still write"
        return f"{who} into it ({', '.join(running)})"


class WritersMixin:
    """Mixed into `ReplayBuffer` (whose state these methods use), to keep its module small."""

    _lock: Any
    _notifier: Any
    _writers: Writers
    _limiter: Any
    _num_valid: int
    _written: int
    _sampled: int
    _stale_dropped: int
    min_size: int
    samples_per_insert: float | None
    tolerance: float | None
    sampler: Any

    def attach_writer(self, name: str = "a collector") -> WriterRecord:
        """Register a collector that will feed the buffer (collectors call this themselves).

        Returns:
            The record to pass to `detach_writer` when the collector stops.
        """
        with self._lock:
            return self._writers.attach(name)

    def detach_writer(
        self, record: WriterRecord | None = None, *, ending: str = "stopped", error: BaseException | None = None
    ) -> None:
        """A collector has stopped feeding the buffer (``ending`` says how, ``error`` if it failed).

        When none is left, samplers stop waiting on the ratio, and a wait that the stored
        frames cannot serve raises `BufferStarvedError` instead of waiting forever.
        """
        with self._lock:
            if record is None:  # the oldest writer still registered
                record = next((r for r in self._writers.records if r.ending is None), None)
            if record is not None and record.ending is None:
                record.ending, record.error = ending, error
        self._notifier.notify_all()

    # -- what a waiter waits for, and why it may never come --------------------------------------
    def _holds(self) -> str:
        stale = f", {self._stale_dropped} dropped as stale" if self._stale_dropped else ""
        return f"the buffer holds {self._num_valid} frames ({self._written} written, {self._sampled} sampled{stale})"

    def _sample_need(self, batch_size: int) -> tuple[str, str]:
        """(what a sample waits for, how to make it servable); call under the lock."""
        if self._written < self.min_size:
            return (
                f"min_size={self.min_size} frames to be written",
                "lower min_size (a trainer's learning_starts) below the frames the collectors write, "
                "or raise their total_frames",
            )
        if self._num_valid == 0:
            if self._stale_dropped:
                return "a stored frame (max_policy_lag dropped the stale ones)", "raise max_policy_lag"
            return "a stored frame", "write frames into it before sampling"
        if not self._limiter.sample_allowed(self._written, self._sampled):
            limiter = f"samples_per_insert={self.samples_per_insert:g}, tolerance {self.tolerance:g} frames"
            return f"the rate limiter ({limiter}) to allow a sample", "let the collectors insert more frames"
        sampler = type(self.sampler).__name__
        return f"frames its {sampler} can return ({batch_size} asked)", "lower batch_size or the sampler's slice length"

    def _account(self, call: str, need: tuple[str, str], timeout: float | None) -> str:
        """Why ``call`` cannot return: for `BufferStarvedError` (``timeout=None``) or `BufferTimeoutError`."""
        what, fix = need
        if timeout is None:
            return (
                f"{call} can never return: it waits for {what}, {self._holds()}, and {self._writers.account()}; {fix}"
            )
        return f"{call} timed out after {timeout:g}s waiting for {what}; {self._holds()} and {self._writers.account()}"

    def _starved(self, call: str, need: tuple[str, str]) -> BufferStarvedError:
        err = BufferStarvedError(self._account(call, need, None))
        err.__cause__ = self._writers.cause()
        return err

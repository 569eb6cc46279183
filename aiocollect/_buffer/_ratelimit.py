"""Reverb-style rate limiting for the replay buffer: a sample-to-insert ratio with a tolerance.

The limiter keeps ``d = samples_per_insert * (inserted - min_size) - sampled`` inside
``(-tolerance, tolerance)``: writers wait while ``d >= tolerance`` (the learner is behind),
samplers while ``d <= -tolerance`` (the collectors are behind). Each call is checked
*before* it runs, so batched calls never deadlock whatever their size: when one side waits,
the other is allowed. One call may overshoot the band by its own size.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RateLimiter"]


@dataclass(frozen=True)
class RateLimiter:
    """The buffer's admission rules (pure: the buffer passes in its counters)."""

    min_size: int
    samples_per_insert: float | None
    tolerance: float | None

    @classmethod
    def build(cls, min_size: int, samples_per_insert: object, tolerance: object, batch_size: int | None) -> RateLimiter:
        """Validate the buffer's rate arguments (``ValueError`` with the rule, value and fix)."""
        spi, tol = samples_per_insert, tolerance
        for name, value, rule in (("samples_per_insert", spi, "a positive number or None"),
                                  ("tolerance", tol, "a positive number of frames or None")):  # fmt: skip
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise TypeError(f"{name} must be {rule}, got {value!r}")
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be {rule}, got {value!r}")
        if tol is None and spi is not None:
            tol = 2.0 * max(batch_size or 1, float(spi))  # type: ignore[arg-type]
        return cls(min_size, None if spi is None else float(spi), None if tol is None else float(tol))  # type: ignore[arg-type]

    def insert_allowed(self, inserted: int, sampled: int) -> bool:
        """May a writer go on, with ``inserted`` frames written or reserved so far?"""
        spi = self.samples_per_insert
        if spi is None or inserted < self.min_size:
            return True
        return spi * (inserted - self.min_size) - sampled < self.tolerance  # type: ignore[operator]

    def sample_allowed(self, written: int, sampled: int, *, ratio: bool = True) -> bool:
        """May a sampler go on, with ``written`` frames committed so far (``ratio=False``: min_size only)?"""
        if written < self.min_size:
            return False
        spi = self.samples_per_insert
        return not ratio or spi is None or spi * (written - self.min_size) - sampled > -self.tolerance  # type: ignore[operator]

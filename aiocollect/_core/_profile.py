"""Profiling a collector's rollouts with ``torch.profiler`` (TorchRL's ``enable_profile``).

A `ProfilerHook` runs as one more post-collect hook where the rollouts run: the collection
thread of an in-process collector, each chosen worker process of a multi-worker one. It
starts the profiler after the warm-up rollouts and stops it, writing the trace, after
``num_rollouts`` rollouts. The profiler object itself is built in that process, lazily: only
the configuration crosses a process boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ProfileConfig", "ProfilerHook"]

_ACTIVITIES = ("cpu", "cuda")


@dataclass
class ProfileConfig:
    """What `enable_profile` profiles, and where the trace goes (TorchRL's ``ProfileConfig``).

    Rollouts ``max(warmup_rollouts, 1) + 1`` to ``num_rollouts`` of each profiled worker are
    recorded (the profiler starts after a rollout, so the first one is never in the trace), as
    in TorchRL.

    Attributes:
        workers: Indices of the workers to profile (multi-worker collectors; an in-process
            collector profiles its own rollouts whatever this says).
        num_rollouts: Rollouts after which profiling stops and the trace is written.
        warmup_rollouts: Rollouts to leave out first (JIT, compilation and caches warm up).
        save_path: Where each trace is written (Chrome trace JSON); ``{worker_idx}`` is
            replaced by the worker's index. ``None``: ``./collector_profile_{worker_idx}.json``.
        activities: ``"cpu"`` and/or ``"cuda"`` (left out where CUDA is not available).
        record_shapes: Record tensor shapes.
        profile_memory: Record memory allocations.
        with_stack: Record Python stacks.
        with_flops: Estimate FLOPs.
        on_trace_ready: Called with the ``torch.profiler.profile`` object instead of writing
            the trace to ``save_path``.

    Raises:
        ValueError: ``num_rollouts`` is not above ``warmup_rollouts``, ``warmup_rollouts`` is
            negative, or an activity is neither ``"cpu"`` nor ``"cuda"``.

    Examples:
        >>> ProfileConfig(workers=[0, 2]).should_profile_worker(2)
        True
        >>> str(ProfileConfig(save_path="trace_{worker_idx}.json").get_save_path(1))
        'trace_1.json'
    """

    workers: list[int] = field(default_factory=lambda: [0])
    num_rollouts: int = 3
    warmup_rollouts: int = 1
    save_path: str | Path | None = None
    activities: list[str] = field(default_factory=lambda: list(_ACTIVITIES))
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = True
    with_flops: bool = False
    on_trace_ready: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if self.warmup_rollouts < 0:
            raise ValueError(f"warmup_rollouts must be >= 0, got {self.warmup_rollouts!r}")
        if self.num_rollouts <= self.warmup_rollouts:
            raise ValueError(
                f"num_rollouts ({self.num_rollouts}) must be greater than warmup_rollouts ({self.warmup_rollouts}): "
                "raise num_rollouts or lower warmup_rollouts"
            )
        unknown = [a for a in self.activities if str(a).lower() not in _ACTIVITIES]
        if unknown:
            raise ValueError(f"profiler activities must be 'cpu' or 'cuda', got {unknown!r}")
        self.workers = [int(w) for w in self.workers]

    def get_save_path(self, worker_idx: int) -> Path:
        """The trace file of worker ``worker_idx``."""
        if self.save_path is None:
            return Path(f"./collector_profile_{worker_idx}.json")
        return Path(str(self.save_path).format(worker_idx=worker_idx))

    def get_activities(self) -> list[Any]:
        """The ``torch.profiler.ProfilerActivity`` values to record (CUDA only where available)."""
        import torch
        from torch.profiler import ProfilerActivity

        wanted = {str(a).lower() for a in self.activities}
        out = [ProfilerActivity.CPU] if "cpu" in wanted else []
        if "cuda" in wanted and torch.cuda.is_available():
            out.append(ProfilerActivity.CUDA)
        return out

    def should_profile_worker(self, worker_idx: int) -> bool:
        """Whether worker ``worker_idx`` is profiled."""
        return worker_idx in self.workers


class ProfilerHook:
    """A post-collect hook that profiles rollouts with ``torch.profiler``; see `ProfileConfig`.

    Call it after each rollout (with the batch, which it ignores). It stops by itself after
    ``config.num_rollouts`` calls; `stop` ends it early, writing the trace of what it recorded.

    Args:
        config: What to profile and where to write the trace.
        worker_idx: The worker it runs in (names its trace file).
    """

    def __init__(self, config: ProfileConfig, worker_idx: int = 0) -> None:
        self.config = config
        self.worker_idx = worker_idx
        self.rollouts = 0
        self._profiler: Any = None
        self._done = False

    def __call__(self, batch: Any = None) -> None:
        if self._done:
            return
        self.rollouts += 1
        if self.rollouts >= self.config.num_rollouts:
            self.stop()
        elif self._profiler is None and self.rollouts >= self.config.warmup_rollouts:
            self._start()

    def _start(self) -> None:
        import torch.profiler

        activities = self.config.get_activities()
        if not activities:  # "cuda" alone on a machine without CUDA: nothing to record
            self._done = True
            return
        cfg = self.config
        self._profiler = torch.profiler.profile(
            activities=activities,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.profile_memory,
            with_stack=cfg.with_stack,
            with_flops=cfg.with_flops,
        )
        self._profiler.start()

    def stop(self) -> None:
        """Stop profiling and write the trace (or call ``on_trace_ready``). Idempotent."""
        if self._done:
            return
        self._done = True
        prof, self._profiler = self._profiler, None
        if prof is None:
            return
        prof.stop()
        if self.config.on_trace_ready is not None:
            self.config.on_trace_ready(prof)
            return
        path = self.config.get_save_path(self.worker_idx)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))

    def __repr__(self) -> str:
        state = "done" if self._done else "recording" if self._profiler is not None else "waiting"
        return f"<ProfilerHook worker {self.worker_idx} [{state} | rollout {self.rollouts}/{self.config.num_rollouts}]>"

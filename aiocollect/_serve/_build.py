"""Building an `AsyncBatchedCollector`'s envs: a `SlotPool` (threads or processes) or an `AsyncEnvPool`.

`CentralEnvs` is the factory the collector hands its in-process machinery as its
``create_env_fn``: called on the collector's thread, it builds the envs where they will step
(here for threads and coroutine envs, in the worker processes otherwise) and returns the
pool the barrier-free rollout steps.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._envs._pool import AsyncEnvPool
from ._shard import build_env, is_coroutine_env, single_env
from ._slots import SlotPool, ThreadShards, default_shard_count, env_name, shard_rows

__all__ = ["ENV_BACKENDS", "CentralEnvs"]

ENV_BACKENDS = ("threading", "multiprocessing", "coroutine")


@dataclass
class CentralEnvs:
    """The envs of an `AsyncBatchedCollector`, built when called (see the module docstring)."""

    fns: Sequence[Any]
    kwargs: Sequence[dict[str, Any]]
    env_backend: str
    envs_per_worker: int | None
    min_ready: int
    max_ready: int
    max_wait: float | None
    start_method: str | None = None
    max_concurrency: int | None = None
    gc_freeze: bool | None = None
    #: ``step_timeout``/``on_timeout``/``on_error`` for coroutine envs (`AsyncEnvPool`'s), if set.
    env_rules: dict[str, Any] = field(default_factory=dict)
    #: One CPU list per env worker process (``worker_affinity``), or None.
    worker_affinity: list[list[int]] | None = None

    def __call__(self) -> Any:
        n = len(self.fns)
        if self.env_backend == "multiprocessing":
            from ._procs import ProcessShards

            shards = shard_rows(n, self.envs_per_worker, default_shard_count())
            procs = ProcessShards(self.fns, self.kwargs, shards, self.start_method, self.worker_affinity)
            return SlotPool(procs, procs.spec, min_ready=self.min_ready, max_ready=self.max_ready,
                            max_wait=self.max_wait, gc_freeze=self.gc_freeze)  # fmt: skip
        envs: list[Any] = []
        try:
            for i, (fn, kw) in enumerate(zip(self.fns, self.kwargs, strict=True)):
                envs.append(build_env(fn, kw))
                envs[-1] = single_env(envs[-1], i)
            coroutine = [is_coroutine_env(e) for e in envs]
            if any(coroutine):
                return self._coroutine_pool(envs, coroutine)
            if self.env_rules:
                raise TypeError(
                    f"{', '.join(self.env_rules)} apply to coroutine envs; env factory 0 returned "
                    f"{type(envs[0]).__name__}, which steps in a thread and raises when it fails: drop them"
                )
            if self.env_backend == "coroutine":
                raise TypeError(
                    "env_backend='coroutine' needs envs whose reset and step are coroutine functions, got "
                    f"{type(envs[0]).__name__}; use env_backend='threading' for gymnasium envs"
                )
            # One thread by default: envs written in Python hold the GIL while they step, and
            # threads that pass it back and forth collect slower than one (64 CartPoles: one
            # thread 1.1-1.4x two). Envs that release it (C simulators, I/O) gain from
            # envs_per_worker < n (64 envs sleeping 1 ms per step: 8 threads ~7x one).
            shards = shard_rows(n, self.envs_per_worker, 1)
            threads = ThreadShards(envs, shards, [env_name(e, i) for i, e in enumerate(envs)])
        except BaseException:
            _close_all(envs)
            raise
        return SlotPool(threads, threads.spec, min_ready=self.min_ready, max_ready=self.max_ready,
                        max_wait=self.max_wait, gc_freeze=self.gc_freeze)  # fmt: skip

    def _coroutine_pool(self, envs: list[Any], coroutine: list[bool]) -> AsyncEnvPool:
        if not all(coroutine):
            i = coroutine.index(False)
            raise TypeError(
                f"AsyncBatchedCollector's env factory {i} returned a synchronous env among coroutine envs; "
                "make every env a coroutine env, or none"
            )
        pool = AsyncEnvPool(envs, min_ready=self.min_ready, max_wait=self.max_wait,
                            max_concurrency=self.max_concurrency, gc_freeze=self.gc_freeze,
                            **self.env_rules)  # fmt: skip
        pool.max_ready = self.max_ready  # type: ignore[attr-defined]  # read by the barrier-free rollout
        return pool


def _close_all(envs: list[Any]) -> None:
    for env in envs:
        close: Callable[[], Any] | None = getattr(env, "close", None)
        if close is not None and not inspect.iscoroutinefunction(close):
            try:
                close()
            except Exception:  # the build error is the one to report
                pass

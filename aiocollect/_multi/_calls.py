"""TorchRL's collector API where it reaches into the workers: hooks, profiling, remote calls, stats.

A worker answers a `RemoteCall` between two commands, in order, with a `Reply` that the pump
files by request number; the caller awaits it like any other worker event (a worker busy
with a batch answers after it). Hooks travel the other way, cloudpickled in a `SetHook`
command (and in the spec of every worker started later), and need no answer: commands are
handled in order, so the next batch runs with them.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import cloudpickle

from .._collect._api import CollectorAPI
from .._core._errors import _RemoteTraceback, add_note
from .._core._profile import ProfileConfig, ProfilerHook
from .._core._remote import call_lists
from .._core._stats import CollectorStats
from .._workers._messages import RemoteCall, Reply, SetHook
from ._config import MultiConfig

__all__ = ["WorkerCalls"]

#: Paths answered by this process: the replay buffer is one object here, which the workers share.
_LOCAL_ROOT = "replay_buffer"
_VERSION = ("collector", "policy_version")


def _root(path: Any) -> str:
    return path.split(".", 1)[0].split("[", 1)[0] if isinstance(path, str) else ""


class WorkerCalls(CollectorAPI):
    """Mixed into `MultiCollectorBase` (not public); see the module docstring."""

    _num_workers: int
    _transport: Any
    _pump: Any
    _generation: list[int]
    _call_seq = 0
    _worker_frames: list[int]
    _worker_batches: list[int]
    _restarts: int
    _dropped_batches: int
    _batch_shapes: dict[int, tuple[int, ...]]
    _mc: MultiConfig
    _closed: bool

    # -- hooks -----------------------------------------------------------------------------------
    def _prepare_hook(self, name: str, hook: Any) -> bytes:
        try:
            return cloudpickle.dumps(hook)
        except Exception as exc:
            raise TypeError(
                f"{name} runs in the worker processes, but {hook!r} cannot be pickled for them ({exc}); pass a "
                "module-level function, a lambda or a functools.partial"
            ) from exc

    def _hook_changed(self, name: str, payload: bytes) -> None:
        self._send_hook(range(self._num_workers), name, lambda w: payload)

    def _send_hook(self, workers: Any, name: str, payload: Any) -> None:
        """Tell the running workers among ``workers``; the others get it in their spec when they start."""
        pump, transport = self._pump, self._transport
        if pump is None or transport is None:
            return
        for w in workers:
            if pump.alive[w]:
                transport.send(w, SetHook(name, payload(w)))

    def _worker_profiler(self, w: int) -> ProfilerHook | None:
        """Worker ``w``'s own profiler hook (its spec), if `enable_profile` chose it."""
        config = self._profile
        return ProfilerHook(config, worker_idx=w) if config is not None and config.should_profile_worker(w) else None

    def _check_profiled_workers(self, config: ProfileConfig) -> None:
        bad = [w for w in config.workers if not 0 <= w < self._num_workers]
        if bad:
            raise ValueError(
                f"enable_profile workers must be worker indices in range({self._num_workers}), got {bad}; "
                "drop them or add workers"
            )

    def _install_profiler(self, config: ProfileConfig) -> None:
        self._send_hook(config.workers, "profiler", lambda w: cloudpickle.dumps(self._worker_profiler(w)))

    def _remove_profiler(self) -> None:
        # Each worker stops its profiler (writing its trace) when it is replaced, or when it stops.
        if self._profile is not None and not self._closed:
            self._send_hook(self._profile.workers, "profiler", lambda w: cloudpickle.dumps(None))

    # -- remote calls ----------------------------------------------------------------------------
    async def _ask(self, what: str, requests: list[tuple[int, str, Any, dict[str, Any]]]) -> list[Any]:
        """Send ``(worker, path, args, kwargs)`` requests; return the answers in order, or raise the first error."""
        await self._ensure_started()  # type: ignore[attr-defined]
        pump, transport = self._pump, self._transport
        sent: list[tuple[int, int, int]] = []  # worker, request number, worker generation
        for w, path, args, kwargs in requests:
            if not pump.alive[w]:
                raise RuntimeError(f"{what} needs worker {w}, which is not running; the collector has failed")
            try:
                request = cloudpickle.dumps((path, args, kwargs))
            except Exception as exc:
                raise TypeError(f"the arguments of {what} cannot be pickled for worker {w}: {exc}") from exc
            self._call_seq += 1
            sent.append((w, self._call_seq, self._generation[w]))
            transport.send(w, RemoteCall(self._call_seq, request))

        def answered() -> bool:  # or the worker is gone: restarted workers never got the request
            return all(s in pump.replies[w] or not pump.alive[w] or self._generation[w] != g for w, s, g in sent)

        await pump.until(answered)
        replies = [(w, pump.replies[w].pop(s, None)) for w, s, _ in sent]
        return [self._unpack(what, w, reply) for w, reply in replies]

    def _unpack(self, what: str, w: int, reply: Reply | None) -> Any:
        if reply is None:
            raise RuntimeError(f"worker {w} stopped before it answered {what}; ask again")
        if reply.exception is None and reply.value is not None:
            return pickle.loads(reply.value)
        where = f"raised in worker {w} (pid {self._transport.pid(w)}) by {what}"
        exc: BaseException | None = None
        if reply.exception is not None:
            try:
                exc = pickle.loads(reply.exception)
            except Exception:
                exc = None
        if not isinstance(exc, BaseException):
            exc = RuntimeError(f"{reply.summary} ({where})")
        exc.__cause__ = _RemoteTraceback(reply.traceback)
        add_note(exc, where)
        raise exc

    async def get_distant_attr(self, attr: str) -> list[Any]:
        """The object at attribute path ``attr`` in each worker, in worker order.

        Paths under ``replay_buffer`` are read in this process (see `map_fn`).

        Raises:
            AttributeError: The path does not exist (raised as the worker raised it).
        """
        if _root(attr) == _LOCAL_ROOT:
            return [await self.cascade_execute(attr) for _ in range(self._num_workers)]
        return await self._ask(f"get_distant_attr({attr!r})", [(w, attr, None, {}) for w in range(self._num_workers)])

    async def map_fn(
        self, method_name: str, list_of_args: list[Any] | None = None, list_of_kwargs: list[Any] | None = None
    ) -> list[Any]:
        """Call the method at ``method_name`` in each worker, with one argument entry per worker.

        Each worker resolves the path on what it shows of itself (TorchRL's inner collector:
        ``worker_idx``, ``env``, ``policy``, ``frames_per_batch``, ``stats``, the hooks and
        these helpers), between two batches. The replay buffer is one object, in this
        process: paths under ``replay_buffer`` are answered here, once per worker.

        Returns:
            The workers' results, in worker order.

        Raises:
            ValueError: A list does not have one entry per worker.
        """
        calls = call_lists(list_of_args, list_of_kwargs, self._num_workers)
        if _root(method_name) == _LOCAL_ROOT:
            return [await self.cascade_execute(method_name, *a, **k) for a, k in calls]
        requests = [(w, method_name, args, kwargs) for w, (args, kwargs) in enumerate(calls)]
        return await self._ask(f"map_fn({method_name!r})", requests)

    async def getattr_env(self, attr: str) -> Any:
        """``getattr(env, attr)`` of worker 0's env (TorchRL's choice)."""
        return (await self._ask(f"getattr_env({attr!r})", [(0, "getattr_env", (attr,), {})]))[0]

    async def getattr_policy(self, attr: str) -> Any:
        """``getattr(policy, attr)`` of worker 0's policy (TorchRL's choice)."""
        return (await self._ask(f"getattr_policy({attr!r})", [(0, "getattr_policy", (attr,), {})]))[0]

    # -- stats -----------------------------------------------------------------------------------
    def stats(self, workers: str = "aggregate") -> CollectorStats:
        """Return a `CollectorStats` snapshot, with the workers' counts (never waits on a worker).

        Args:
            workers: ``"aggregate"`` (default): the collector's counters, with ``workers``,
                ``workers_alive``, ``restarts``, ``dropped_batches`` and ``stalled_workers``.
                ``"per_worker"``: ``workers``, ``workers_alive`` and, for each worker ``i``,
                ``"worker_<i>/<metric>"`` (``frames`` and ``batches`` it delivered,
                ``requested_frames_per_batch``, the ``policy_version`` it acknowledged,
                ``alive``, ``restarts``), counted in this process. ``"both"``: the union.

        Raises:
            ValueError: ``workers`` is none of those.
        """
        if workers not in ("aggregate", "per_worker", "both"):
            raise ValueError(f"workers must be one of 'aggregate', 'per_worker' or 'both', got {workers!r}")
        pump, n = self._pump, self._num_workers
        fields = self._stats_fields() if workers != "per_worker" else {}  # type: ignore[attr-defined]
        fields.update(workers=n, workers_alive=sum(pump.alive) if pump is not None else 0)
        if workers != "per_worker":
            stalled = self._stalled_workers()  # type: ignore[attr-defined]
            fields.update(restarts=self._restarts, dropped_batches=self._dropped_batches, stalled_workers=stalled)
        if workers != "aggregate":
            for w in range(n):
                fields.update({f"worker_{w}/{k}": v for k, v in self._worker_stats(w).items()})
        return CollectorStats(fields)

    def _count_worker(self, w: int, batch: Any) -> None:
        """Count a batch taken from worker ``w`` (a preempted worker's untaken steps have version -1)."""
        self._worker_batches[w] += 1
        version = batch.get(_VERSION, None) if self._mc.preemptive_threshold is not None else None
        self._worker_frames[w] += int((version >= 0).sum()) if version is not None else batch.numel()

    def _worker_stats(self, w: int) -> dict[str, Any]:
        pump, shape = self._pump, self._batch_shapes.get(w)
        return {
            "frames": self._worker_frames[w],
            "batches": self._worker_batches[w],
            "requested_frames_per_batch": math.prod(shape) if shape else self._mc.worker_cfgs[w].frames_per_batch,
            "policy_version": max(pump.acked[w], 0) if pump is not None else 0,
            "alive": bool(pump is not None and pump.alive[w]),
            "restarts": self._generation[w],
        }

"""Blocking twins of aiocollect's asyncio-native classes, for plain (non-async) scripts.

Each class here wraps exactly one async object and has the same name and methods as its
async twin; only ``aclose()`` becomes ``shutdown()``. They must not be used from inside a
running event loop: use the async classes there.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from functools import partial as _partial
from typing import Any

import torch
from tensordict import TensorDictBase

from ._buffer import _buffer
from ._collect import _central, _collector
from ._collect._blocking_base import DataCollectorBase
from ._collect._dispatch import FrontDoor as _FrontDoor
from ._collect._twins import twin_doc as _twin_doc
from ._collect._twins import twin_init as _twin_init
from ._core._errors import BufferClosedError as _BufferClosedError
from ._core._errors import WouldBlock as _WouldBlock
from ._core._portal import Portal as _Portal
from ._core._public import publish_loaded as _publish_loaded
from ._core._stats import BufferStats as _BufferStats
from ._dist import _collectors as _dist
from ._dist import _ray_collector as _ray
from ._dist import _rpc_collector as _rpc
from ._multi import _collectors as _multi

__all__ = (
    "AsyncBatchedCollector",
    "AsyncCollector",
    "Collector",
    "DataCollectorBase",
    "DistributedCollector",
    "DistributedSyncCollector",
    "MultiAsyncCollector",
    "MultiSyncCollector",
    "RPCCollector",
    "RayCollector",
    "ReplayBuffer",
)


class Collector(DataCollectorBase, metaclass=_FrontDoor, targets="aiocollect.blocking"):
    """Blocking twin of `aiocollect.Collector` (also exported as ``aiocollect.SyncDataCollector``).

    Takes the same arguments. Iterate with ``for batch in collector``; leaving ``with``,
    exhausting the budget or calling `shutdown` closes the env and the portal thread. The
    rest is `aiocollect.Collector`'s documentation: read ``with``/``for`` for
    ``async with``/``async for`` and `shutdown` for ``aclose()``. Where the selector
    arguments (``backend``, ``num_collectors``, ``sync``, ``backend_options``) choose another
    collector, the object returned is that collector's blocking twin, from this module.

    {args}

    Examples:
        >>> from aiocollect.blocking import Collector
        >>> with Collector("CartPole-v1", frames_per_batch=16, total_frames=32) as c:
        ...     shapes = [batch.shape for batch in c]
        >>> shapes
        [torch.Size([16]), torch.Size([16])]
    """

    _async_class = _collector.Collector


class _WorkerProcessTwin(DataCollectorBase):
    """What the blocking twins of the worker-process collectors add: TorchRL's per-worker queries."""

    def frames_per_batch_worker(self, *, worker_idx: int | None = None) -> int:
        """Frames each worker is asked for per batch; see the async twin's method."""
        return int(self._async.frames_per_batch_worker(worker_idx=worker_idx))


class MultiSyncCollector(_WorkerProcessTwin):
    """Blocking twin of `aiocollect.MultiSyncCollector` (also exported as ``aiocollect.MultiSyncDataCollector``).

    The same collector for plain scripts; the rest is `aiocollect.MultiSyncCollector`'s
    documentation: read ``with``/``for`` for ``async with``/``async for`` and `shutdown` for
    ``aclose()``.

    {args}

    Examples:
        >>> from aiocollect.blocking import MultiSyncCollector
        >>> if __name__ == "__main__":  # worker processes re-import the main module
        ...     with MultiSyncCollector("CartPole-v1", num_workers=2, frames_per_batch=64,
        ...                             total_frames=128) as c:
        ...         shapes = [batch.shape for batch in c]
    """

    _async_class = _multi.MultiSyncCollector


class MultiAsyncCollector(_WorkerProcessTwin):
    """Blocking twin of `aiocollect.MultiAsyncCollector` (also exported as ``aiocollect.MultiaSyncDataCollector``).

    The same collector for plain scripts; the rest is `aiocollect.MultiAsyncCollector`'s
    documentation: read ``with``/``for`` for ``async with``/``async for`` and `shutdown` for
    ``aclose()``.

    {args}

    Examples:
        >>> from aiocollect.blocking import MultiAsyncCollector
        >>> if __name__ == "__main__":
        ...     with MultiAsyncCollector("CartPole-v1", num_workers=2, frames_per_batch=32,
        ...                              total_frames=64) as c:
        ...         shapes = [batch.shape for batch in c]
    """

    _async_class = _multi.MultiAsyncCollector


class DistributedCollector(DataCollectorBase):
    """Blocking twin of `aiocollect.DistributedCollector` (also exported as ``aiocollect.DistributedDataCollector``).

    The same collector for plain scripts; the rest is `aiocollect.DistributedCollector`'s
    documentation: read ``with``/``for`` for ``async with``/``async for`` and `shutdown` for
    ``aclose()``.

    {args}

    Examples:
        >>> from aiocollect.blocking import DistributedCollector
        >>> if __name__ == "__main__":  # nodes re-import the main module
        ...     with DistributedCollector(["CartPole-v1"] * 2, frames_per_batch=64, total_frames=128,
        ...                               launcher="mp", sync=True) as c:
        ...         shapes = [batch.shape for batch in c]
    """

    _async_class = _dist.DistributedCollector


class DistributedSyncCollector(DataCollectorBase):
    """Blocking twin of `aiocollect.DistributedSyncCollector` (``aiocollect.DistributedSyncDataCollector``).

    The same collector for plain scripts; the rest is
    `aiocollect.DistributedSyncCollector`'s documentation: read ``with``/``for`` for ``async
    with``/``async for`` and `shutdown` for ``aclose()``.

    {args}

    Examples:
        >>> from aiocollect.blocking import DistributedSyncCollector
        >>> if __name__ == "__main__":
        ...     with DistributedSyncCollector(["CartPole-v1"] * 2, frames_per_batch=64, total_frames=128,
        ...                                   launcher="mp") as c:
        ...         shapes = [batch.shape for batch in c]
    """

    _async_class = _dist.DistributedSyncCollector


class RayCollector(DataCollectorBase):
    """Blocking twin of `aiocollect.RayCollector` (also ``aiocollect.RayDataCollector``, TorchRL's name).

    The same collector for plain scripts; the rest is `aiocollect.RayCollector`'s
    documentation: read ``with``/``for`` for ``async with``/``async for`` and `shutdown` for
    ``aclose()``.

    {args}

    Examples:
        >>> from aiocollect.blocking import RayCollector
        >>> with RayCollector(["CartPole-v1"] * 2, frames_per_batch=64, total_frames=128,
        ...                   ray_init_config={"num_cpus": 2}) as c:  # doctest: +SKIP
        ...     shapes = [batch.shape for batch in c]
    """

    _async_class = _ray.RayCollector

    @property
    def num_workers(self) -> int:
        """The number of actors (TorchRL's ``num_workers``: ``num_collectors``)."""
        return self._async.num_workers

    def local_policy(self) -> Any:
        """The policy this process holds (TorchRL's method): what ``policy=`` was given, or ``None``."""
        return self._async.local_policy()


class RPCCollector(DataCollectorBase):
    """Blocking twin of `aiocollect.RPCCollector` (also ``aiocollect.RPCDataCollector``, TorchRL's name).

    The same collector for plain scripts; the rest is `aiocollect.RPCCollector`'s
    documentation: read ``with``/``for`` for ``async with``/``async for`` and `shutdown` for
    ``aclose()``.

    {args}

    Examples:
        >>> from aiocollect.blocking import RPCCollector
        >>> if __name__ == "__main__":  # nodes re-import the main module
        ...     with RPCCollector(["CartPole-v1"] * 2, frames_per_batch=64, total_frames=128,
        ...                       launcher="mp") as c:
        ...         shapes = [batch.shape for batch in c]
    """

    _async_class = _rpc.RPCCollector


class AsyncCollector(_WorkerProcessTwin):
    """Blocking twin of `aiocollect.AsyncCollector` (also exported as ``aiocollect.aSyncDataCollector``).

    The same collector for plain scripts; the rest is `aiocollect.AsyncCollector`'s
    documentation: read ``with``/``for`` for ``async with``/``async for`` and `shutdown` for
    ``aclose()``.

    {args}

    Examples:
        >>> from aiocollect.blocking import AsyncCollector
        >>> if __name__ == "__main__":
        ...     with AsyncCollector("CartPole-v1", frames_per_batch=32, total_frames=64) as c:
        ...         shapes = [batch.shape for batch in c]
    """

    _async_class = _multi.AsyncCollector


class AsyncBatchedCollector(DataCollectorBase):
    """Blocking twin of `aiocollect.AsyncBatchedCollector` (TorchRL's ``AsyncBatchedCollector``).

    The same collector for plain scripts; the rest is `aiocollect.AsyncBatchedCollector`'s
    documentation: read ``with``/``for`` for ``async with``/``async for`` and `shutdown` for
    ``aclose()``.

    {args}

    Examples:
        >>> import gymnasium as gym
        >>> from aiocollect.blocking import AsyncBatchedCollector
        >>> with AsyncBatchedCollector([lambda: gym.make("CartPole-v1")] * 4, frames_per_batch=32,
        ...                            total_frames=64) as c:
        ...     shapes = [batch.shape for batch in c]
        >>> shapes
        [torch.Size([32]), torch.Size([32])]
    """

    _async_class = _central.AsyncBatchedCollector


class ReplayBuffer:
    """Blocking twin of `aiocollect.ReplayBuffer`: the same buffer, with waits that block the thread.

    Takes the same arguments. `extend`, `sample` and `wait_for` wait (rate limiter,
    ``min_size``) by blocking the calling thread; the other methods never wait and are
    safe to call from any thread. A collector given this buffer writes into it directly.
    The rest is `aiocollect.ReplayBuffer`'s documentation: read `close` for ``aclose()``,
    and a call that blocks for one that is awaited.

    {args}

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from aiocollect.blocking import ReplayBuffer
        >>> rb = ReplayBuffer(100, batch_size=2, seed=0)
        >>> _ = rb.extend(TensorDict(observation=torch.arange(4.0), batch_size=[4]))
        >>> rb.sample().shape
        torch.Size([2])
        >>> rb.close()
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._async = _buffer.ReplayBuffer(*args, **kwargs)
        self._portal = _Portal("aiocollect.blocking.ReplayBuffer", "aiocollect.ReplayBuffer")

    def extend(self, td: TensorDictBase) -> torch.Tensor:
        """Append a batch, waiting while the rate limiter holds writers back; returns the indices."""
        # The portal (an event-loop thread) is only needed to wait: a call that need not
        # wait runs here, which saves a thread hand-off per call.
        try:
            return self._async.extend_nowait(td)
        except _WouldBlock:
            return self._portal.call(self._async.extend, td)

    def sample(self, batch_size: int | None = None, *, timeout: float | None = None) -> TensorDictBase:
        """Sample frames, waiting for ``min_size`` and the rate limiter (at most ``timeout`` s); see the async twin."""
        try:
            return self._async.sample_nowait(batch_size)
        except _WouldBlock:
            return self._portal.call(_partial(self._async.sample, batch_size, timeout=timeout))

    def sample_nowait(self, batch_size: int | None = None) -> TensorDictBase:
        """Sample without waiting (raises ``BufferEmptyError``/``WouldBlock`` instead)."""
        return self._async.sample_nowait(batch_size)

    def wait_for(self, n: int, *, timeout: float | None = None) -> None:
        """Block until at least ``n`` frames are stored (at most ``timeout`` s); see the async twin."""
        self._portal.call(_partial(self._async.wait_for, n, timeout=timeout))

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor | float) -> None:
        """Set priorities (with a ``PrioritizedSampler``)."""
        self._async.update_priority(index, priority)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume; see the async twin."""
        return self._async.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`."""
        self._async.load_state_dict(state)

    def dumps(self, path: str) -> None:
        """Write the buffer to directory ``path``."""
        self._async.dumps(path)

    def loads(self, path: str) -> None:
        """Restore a buffer written by `dumps`."""
        self._async.loads(path)

    def stats(self) -> _BufferStats:
        """Return a `BufferStats` snapshot."""
        return self._async.stats()

    @property
    def write_count(self) -> int:
        """Frames ever committed."""
        return self._async.write_count

    @property
    def policy_version(self) -> int:
        """The newest policy version the buffer knows of."""
        return self._async.policy_version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self._async.policy_version = version

    @property
    def storage(self) -> Any:
        """The buffer's `Storage`."""
        return self._async.storage

    def __len__(self) -> int:
        return len(self._async)

    def __getitem__(self, index: Any) -> TensorDictBase:
        """Frames in write order, oldest first (``rb[0]``, ``rb[:n]``, ``rb[-1]``); see `aiocollect.ReplayBuffer`."""
        return self._async[index]

    def __iter__(self) -> Iterator[TensorDictBase]:
        """Sampled batches, `sample` after `sample`, until the buffer is closed."""
        while True:
            try:
                yield self.sample()
            except _BufferClosedError:
                return

    def close(self) -> None:
        """Release the storage and stop the portal thread. Idempotent."""
        self._async.close_now()
        self._portal.stop()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._async).replace("<ReplayBuffer", "<blocking.ReplayBuffer", 1)

    def __del__(self) -> None:
        # Never wait here (see DataCollectorBase.__del__): warn, free without blocking.
        inner, portal = getattr(self, "_async", None), getattr(self, "_portal", None)
        if inner is None or portal is None:
            return
        if not inner.closed:
            warnings.warn(f"unclosed {self!r}; use 'with' or call close()", ResourceWarning, stacklevel=1)
            inner.close_now(blocking=False)
        portal.stop_nowait()


ReplayBuffer.__init__ = _twin_init(ReplayBuffer, _buffer.ReplayBuffer, ReplayBuffer.__init__)  # type: ignore[method-assign]
ReplayBuffer.__doc__ = _twin_doc(ReplayBuffer, _buffer.ReplayBuffer)

# A script that imports only this module never looks a name up in the package: publish the
# public classes its import loaded (their bases, the errors), as the package's lookup would.
_publish_loaded()

"""Blocking twins of aiocollect's asyncio-native classes, for plain (non-async) scripts.

Each class here wraps exactly one async object and has the same name and methods as its
async twin; only ``aclose()`` becomes ``shutdown()``. They must not be used from inside a
running event loop: use the async classes there.
"""

from __future__ import annotations

from . import _collector, _multi
from ._blocking_base import DataCollectorBase

__all__ = ("AsyncCollector", "Collector", "DataCollectorBase", "MultiAsyncCollector", "MultiSyncCollector")


class Collector(DataCollectorBase):
    """Blocking twin of `aiocollect.Collector` (also exported as ``SyncDataCollector``).

    Takes the same arguments. Iterate with ``for batch in collector``; leaving ``with``,
    exhausting the budget or calling `shutdown` closes the env and the portal thread.

    Examples:
        >>> from aiocollect.blocking import Collector
        >>> with Collector("CartPole-v1", frames_per_batch=16, total_frames=32) as c:
        ...     shapes = [batch.shape for batch in c]
        >>> shapes
        [torch.Size([16]), torch.Size([16])]
    """

    _async_class = _collector.Collector


class MultiSyncCollector(DataCollectorBase):
    """Blocking twin of `aiocollect.MultiSyncCollector` (also ``MultiSyncDataCollector``).

    Examples:
        >>> from aiocollect.blocking import MultiSyncCollector
        >>> if __name__ == "__main__":  # worker processes re-import the main module
        ...     with MultiSyncCollector("CartPole-v1", num_workers=2, frames_per_batch=64,
        ...                             total_frames=128) as c:
        ...         shapes = [batch.shape for batch in c]
    """

    _async_class = _multi.MultiSyncCollector


class MultiAsyncCollector(DataCollectorBase):
    """Blocking twin of `aiocollect.MultiAsyncCollector` (also ``MultiaSyncDataCollector``).

    Examples:
        >>> from aiocollect.blocking import MultiAsyncCollector
        >>> if __name__ == "__main__":
        ...     with MultiAsyncCollector("CartPole-v1", num_workers=2, frames_per_batch=32,
        ...                              total_frames=64) as c:
        ...         shapes = [batch.shape for batch in c]
    """

    _async_class = _multi.MultiAsyncCollector


class AsyncCollector(DataCollectorBase):
    """Blocking twin of `aiocollect.AsyncCollector` (also ``aSyncDataCollector``).

    Examples:
        >>> from aiocollect.blocking import AsyncCollector
        >>> if __name__ == "__main__":
        ...     with AsyncCollector("CartPole-v1", frames_per_batch=32, total_frames=64) as c:
        ...         shapes = [batch.shape for batch in c]
    """

    _async_class = _multi.AsyncCollector

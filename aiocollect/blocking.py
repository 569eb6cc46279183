"""Blocking twins of aiocollect's asyncio-native classes, for plain (non-async) scripts.

Each class here wraps exactly one async object and has the same name and methods as its
async twin; only ``aclose()`` becomes ``shutdown()``. They must not be used from inside a
running event loop: use the async classes there.
"""

from __future__ import annotations

from . import _collector
from ._blocking_base import DataCollectorBase

__all__ = ("Collector", "DataCollectorBase")


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

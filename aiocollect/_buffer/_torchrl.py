"""A TorchRL replay buffer (``torchrl.data.ReplayBuffer`` and its subclasses) as a collector's sink.

Collectors write into aiocollect's own `ReplayBuffer` directly (workers fill its shared rows);
a TorchRL buffer has no such protocol, so collectors hand it whole batches, as TorchRL's own
collectors do (``rb.extend(batch)``), from a worker thread: TorchRL's ``extend`` takes its
replay lock and may write a memmap, and the event loop never waits on either. The user
samples from the TorchRL buffer itself (``rb.sample()``, from any thread).

A failure of background collection cannot surface through TorchRL's ``sample``, so it is
kept and raised by the collector's ``async_shutdown()`` (or on leaving ``async with``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._core._optional import is_instance_of
from .._core._threads import to_thread

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = ["TorchRLBufferSink", "is_torchrl_buffer"]


def is_torchrl_buffer(obj: Any) -> bool:
    """True if ``obj`` is a ``torchrl.data.ReplayBuffer`` (never imports torchrl itself)."""
    return is_instance_of(obj, "torchrl.data", "ReplayBuffer")


@dataclass(frozen=True)
class _StorageInfo:
    ndim: int  # the TorchRL storage's ndim: 1 stores frames, 2 stores [env, time] rows


class TorchRLBufferSink:
    """Feeds a TorchRL replay buffer with collector batches; see the module docstring.

    Args:
        rb: The ``torchrl.data.ReplayBuffer`` (``TensorDictReplayBuffer``,
            ``TensorDictPrioritizedReplayBuffer``, ...).
    """

    #: Collectors write aiocollect buffers row by row in place; this one takes whole batches.
    direct_writes = False

    def __init__(self, rb: Any) -> None:
        self.rb = rb
        self.storage = _StorageInfo(int(getattr(rb._storage, "ndim", 1) or 1))
        self.policy_version = 0  # set by the collectors, as on aiocollect's buffer
        self._written = 0
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        # async_shutdown() raises a background error unless a sample() already did: TorchRL's
        # sample() never raises it, so it is always left to async_shutdown().
        self._error_delivered = False

    def __repr__(self) -> str:
        return f"TorchRLBufferSink({type(self.rb).__name__}, written={self._written})"

    @property
    def write_count(self) -> int:
        """Frames written so far (what ``init_random_frames`` counts against)."""
        return self._written

    def attach_writer(self, name: str = "a collector") -> None:
        """A collector starts writing (TorchRL buffers do not track writers)."""

    def detach_writer(self, record: object = None, *, ending: str = "", error: BaseException | None = None) -> None:
        """A collector stopped writing."""

    def fail(self, error: BaseException) -> None:
        """Keep background collection's error (the collector raises it at shutdown)."""
        self._error = error

    async def extend(self, td: TensorDictBase) -> None:
        """``rb.extend(td)`` in a worker thread; counts the frames once it returned."""
        await to_thread(self.rb.extend, td)
        with self._lock:
            self._written += td.numel()

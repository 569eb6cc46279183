"""A TorchRL replay buffer (``torchrl.data.ReplayBuffer`` and its subclasses) as a collector's sink.

Collectors write into aiocollect's own `ReplayBuffer` directly (workers fill its shared rows);
a TorchRL buffer has no such protocol, so collectors hand it batches the way TorchRL's own
collectors do: each worker's ``[*env_batch, T]`` batch is its own ``rb.extend`` (a
multi-process batch is never written as one stacked entry), ``extend_buffer=False`` is one
``rb.add`` per time step, and complete trajectories are written flat. Every call runs in a
worker thread: TorchRL's ``extend`` takes its replay lock and may write a memmap, and the
event loop never waits on either. The user samples from the TorchRL buffer itself
(``rb.sample()``, from any thread).

A failure of background collection cannot surface through TorchRL's ``sample``, so it is
kept and raised by the collector's ``async_shutdown()`` (or on leaving ``async with``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

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


def _call_boxed(box: list[Any]) -> None:
    box[0](*box[1:])


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
        await self.extend_each([td])

    async def extend_each(self, tds: Sequence[TensorDictBase]) -> None:
        """One ``rb.extend`` per TensorDict, in order, in one worker thread call."""
        await self._in_thread(tds, False)

    async def add_steps(self, td: TensorDictBase) -> None:
        """One ``rb.add`` per time step of a ``[*env_batch, T]`` batch (TorchRL's ``extend_buffer=False``).

        Each step is one entry of the buffer, of shape ``env_batch``, as TorchRL's collector
        adds it.
        """
        await self._in_thread([td], True)

    async def _in_thread(self, tds: Sequence[TensorDictBase], per_step: bool) -> None:
        # An idle anyio worker thread holds on to its last call's function and arguments until
        # its next call (or for 10 s): it gets a box, emptied once the call returned, so it
        # never keeps the user's buffer (a memmap storage, say) or the batches alive.
        box: list[Any] = [self._write, tds, per_step]
        try:
            await to_thread(_call_boxed, box)
        finally:
            box.clear()

    def _write(self, tds: Sequence[TensorDictBase], per_step: bool) -> None:
        for td in tds:
            n = td.batch_size.numel()  # (TensorDict.numel() is at least 1)
            if n == 0:  # TorchRL refuses an empty extend; there is nothing to store
                continue
            td = self._on_storage_device(td)
            if per_step:
                for t in range(td.shape[-1]):
                    self.rb.add(td[..., t])
            else:
                self.rb.extend(td)
            with self._lock:
                self._written += n

    def _on_storage_device(self, td: TensorDictBase) -> TensorDictBase:
        # As TorchRL's collectors do: a batch whose tensors all sit on the storage's device gets
        # that device as its own (a postproc may have cleared it), so the storage keeps its device.
        device = getattr(self.rb._storage, "device", None)
        if device is None or device == "auto" or td.device == torch.device(device):
            return td
        device = torch.device(device)
        leaves = td.values(include_nested=True, leaves_only=True)
        if any(getattr(v, "device", device) != device for v in leaves):
            return td
        td = td.copy()
        td.clear_device_()
        return td.to(device)

"""Replay-buffer storages: one preallocated ring of frames, built lazily from the first batch.

Every storage keeps each key as one flat tensor ``[capacity, *frame_shape]``, so a batch of
``[*B, T]`` frames (env-major, time last) lands in one contiguous run of rows: each env's
steps stay next to each other, and with ``ndim=2`` rows of ``T`` frames are never split.
The three kinds differ only in where that memory lives:

* `MemoryStorage`: process-local tensors;
* `SharedMemoryStorage`: one anonymous shared block (memfd) that worker processes map, so
  they write batches straight into the buffer;
* `MemmapStorage`: one file per key in a directory (larger than RAM; survives the process),
  which workers map by path.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .._core._shm import Layout, SharedBlock, layout_nbytes

__all__ = ["MemmapStorage", "MemoryStorage", "SharedMemoryStorage", "Storage", "attach_storage", "make_storage"]

if TYPE_CHECKING:  # a worker maps storages (attach_storage) without importing tensordict
    from tensordict import TensorDict, TensorDictBase

#: A contiguous run of rows: (first row, number of rows).
Piece = tuple[int, int]
_HOST_KEYS = (("collector", "traj_ids"), ("collector", "worker_id"), ("collector", "policy_version"))


def frame_layout(td: TensorDictBase, batch_dims: int) -> list[tuple[Any, tuple[int, ...], torch.dtype]]:
    """The per-frame layout of ``td``: its leaves with the first ``batch_dims`` dims removed."""
    return [
        (k, tuple(v.shape[batch_dims:]), v.dtype)
        for k, v in td.items(include_nested=True, leaves_only=True)
        if isinstance(v, torch.Tensor)
    ]


class Storage:
    """Where a `ReplayBuffer` keeps its frames: a ring of preallocated tensors.

    A storage is created empty and built by the buffer from the first batch it receives
    (its keys, shapes and dtypes). It is not meant to be used on its own.

    Args:
        ndim: ``1`` stores frames; ``2`` stores rows of ``T`` frames (``T`` is the time length
            of the first batch) so ``[env, time]`` rollouts stay whole and the capacity is
            rounded down to a multiple of ``T``.

    Examples:
        >>> from aiocollect import ReplayBuffer, SharedMemoryStorage
        >>> rb = ReplayBuffer(1000, storage=SharedMemoryStorage(ndim=2))
        >>> rb.storage.built
        False
    """

    kind: ClassVar[str] = "base"
    shareable: ClassVar[bool] = False
    #: Where the frames live; ``None``: host memory.
    device: torch.device | None = None

    def __init__(self, *, ndim: int = 1) -> None:
        if ndim not in (1, 2) or isinstance(ndim, bool):
            raise ValueError(f"ndim must be 1 or 2, got {ndim!r}")
        self.ndim = ndim
        self.capacity = 0
        self.row_length: int | None = None
        self.layout: list[tuple[Any, tuple[int, ...], torch.dtype]] = []
        self.tensors: dict[Any, torch.Tensor] = {}
        self._host: dict[Any, torch.Tensor] | None = None

    @property
    def host(self) -> dict[Any, torch.Tensor]:
        """The columns the buffer's bookkeeping reads (trajectory and worker ids, policy
        versions), in host memory: the storage's own tensors, or copies of them (see `sync_host`)."""
        return self.tensors if self._host is None else self._host

    def sync_host(self, index: torch.Tensor) -> None:
        """Bring `host`'s copies of the rows at ``index`` (just written) up to date."""
        if self._host is None:
            return
        on_device = index.to(self.device)
        for k, h in self._host.items():
            h[index] = self.tensors[k].index_select(0, on_device).cpu()

    @property
    def built(self) -> bool:
        """Whether the storage has been allocated."""
        return bool(self.tensors)

    def nbytes(self) -> int:
        """Bytes of frame data held."""
        return layout_nbytes(self._full_layout())

    def _full_layout(self) -> list[tuple[Any, tuple[int, ...], torch.dtype]]:
        return [(k, (self.capacity, *shape), dtype) for k, shape, dtype in self.layout]

    def build(self, capacity: int, layout: Layout, row_length: int) -> None:
        """Allocate room for ``capacity`` frames of ``layout``.

        Args:
            capacity: Frames requested (rounded down to whole rows when ``ndim=2``).
            layout: ``(key, frame_shape, dtype)`` of every leaf.
            row_length: Time length ``T`` of the batches (used when ``ndim=2``).
        """
        if self.ndim == 2:
            if capacity < row_length:
                raise ValueError(
                    f"capacity {capacity} is smaller than one row of {row_length} frames (ndim=2 storage); "
                    "raise capacity or use ndim=1"
                )
            capacity -= capacity % row_length
            self.row_length = row_length
        self.capacity = capacity
        self.layout = [(k, tuple(shape), dtype) for k, shape, dtype in layout]
        self.tensors = self._allocate(self._full_layout())
        if self.device is not None:
            # Samplers and reservations index these with host tensors at every write and sample.
            self._host = {k: torch.zeros_like(t, device="cpu") for k, t in self.tensors.items() if k in _HOST_KEYS}

    def _allocate(self, layout: Layout) -> dict[Any, torch.Tensor]:
        raise NotImplementedError

    def check(self, td: TensorDictBase, batch_dims: int) -> None:
        """Raise ``ValueError`` unless ``td``'s frames have exactly the stored keys, shapes and dtypes."""
        got = {k: (shape, dtype) for k, shape, dtype in frame_layout(td, batch_dims)}
        for key, shape, dtype in self.layout:
            if key not in got:
                raise ValueError(
                    f"batch is missing the key {key!r} the buffer stores; extend with the same keys each time"
                )
            if got[key] != (shape, dtype):
                raise ValueError(
                    f"batch entry {key!r} has frame shape {got[key][0]} and dtype {got[key][1]}, "
                    f"but the buffer stores {shape} {dtype}; extend with the same layout each time"
                )
        extra = sorted(str(k) for k in set(got) - {k for k, _, _ in self.layout})
        if extra:
            raise ValueError(
                f"batch has entries {extra} the buffer does not store; extend with the same keys each time"
            )

    def check_layout(self, layout: Layout) -> None:
        """Raise ``ValueError`` unless frames of ``layout`` are exactly what the storage holds."""
        mine = {k: (tuple(shape), dtype) for k, shape, dtype in self.layout}
        theirs = {k: (tuple(shape), dtype) for k, shape, dtype in layout}
        if mine != theirs:
            diff = sorted(str(k) for k in set(mine) ^ set(theirs)) or sorted(
                str(k) for k in mine if mine[k] != theirs.get(k)
            )
            raise ValueError(
                f"the collector's batches do not match what the buffer already stores (entries {diff} differ); "
                "give each kind of batch its own ReplayBuffer"
            )

    def views(self, pieces: Sequence[Piece], batch_shape: Sequence[int]) -> dict[Any, torch.Tensor] | None:
        """Views of one contiguous region shaped like a batch, or ``None`` if it wraps around."""
        if len(pieces) != 1:
            return None
        start, n = pieces[0]
        return {k: t[start : start + n].view(*batch_shape, *t.shape[1:]) for k, t in self.tensors.items()}

    def write(self, pieces: Sequence[Piece], flat: dict[Any, torch.Tensor]) -> None:
        """Copy ``flat`` (each ``[n, *frame_shape]``) into the rows named by ``pieces``."""
        offset = 0
        for start, n in pieces:
            for k, t in self.tensors.items():
                t[start : start + n].copy_(flat[k][offset : offset + n])
            offset += n

    def gather(self, index: torch.Tensor) -> TensorDict:
        """A new TensorDict ``[len(index)]`` holding copies of the frames at ``index``."""
        from tensordict import TensorDict

        if self.device is not None:
            index = index.to(self.device)
        out = {k: torch.index_select(t, 0, index) for k, t in self.tensors.items()}
        return TensorDict(out, batch_size=[index.numel()], device=self.device)

    def share(self) -> tuple[Any, int | None]:
        """A picklable handle (and an fd to send, or ``None``) from which a worker maps the storage."""
        raise TypeError(
            f"{type(self).__name__} lives in this process only; worker processes need "
            "SharedMemoryStorage or MemmapStorage"
        )

    def state(self) -> dict[str, Any]:
        """Shape information for ``state_dict`` (the data itself is added by the buffer)."""
        return {"kind": self.kind, "ndim": self.ndim, "capacity": self.capacity, "row_length": self.row_length,
                "layout": self.layout}  # fmt: skip

    def close(self) -> None:
        """Release the memory (views handed out before stay valid until dropped)."""
        self.tensors, self._host = {}, None


class MemoryStorage(Storage):
    """Frames in ordinary process-local memory (the default), on the host or on a device.

    Args:
        ndim: See `Storage`.
        device: Where the frames live (``"cuda"``: batches are copied to the GPU as they are
            written, and samples are drawn there, ready for the learner). ``None``: host memory.
            The small columns samplers read (trajectory and worker ids, policy versions) are
            kept in host memory too, so sampling never waits on the device.

    Examples:
        >>> from aiocollect import MemoryStorage, ReplayBuffer
        >>> rb = ReplayBuffer(100, storage=MemoryStorage())
    """

    kind = "memory"

    def __init__(self, *, ndim: int = 1, device: Any = None) -> None:
        super().__init__(ndim=ndim)
        self.device = None if device is None else torch.device(device)

    def _allocate(self, layout: Layout) -> dict[Any, torch.Tensor]:
        return {k: torch.zeros(shape, dtype=dtype, device=self.device) for k, shape, dtype in layout}


class SharedMemoryStorage(Storage):
    """Frames in one anonymous shared-memory block that worker processes write into directly.

    Nothing appears in ``/dev/shm``: the block is a Linux memfd, freed by the kernel once the
    last process that maps it lets go (even if processes are killed).

    Examples:
        >>> from aiocollect import ReplayBuffer, SharedMemoryStorage
        >>> rb = ReplayBuffer(10_000, storage=SharedMemoryStorage())
    """

    kind = "shared"
    shareable = True

    def __init__(self, *, ndim: int = 1) -> None:
        super().__init__(ndim=ndim)
        self._block: SharedBlock | None = None

    def _allocate(self, layout: Layout) -> dict[Any, torch.Tensor]:
        self._block = SharedBlock(layout_nbytes(layout))
        return self._block.views(layout)

    def share(self) -> tuple[Any, int | None]:
        assert self._block is not None and self._block.fd is not None
        return ("shared", self._block.size, self._full_layout()), self._block.fd

    def close(self) -> None:
        if self._block is not None:
            self._block.close_fd()
            self._block = None
        super().close()


class MemmapStorage(Storage):
    """Frames in memory-mapped files, one per key, in a directory (may be larger than RAM).

    Args:
        path: Directory for the files; created if needed. ``None`` uses a temporary
            directory that is deleted by ``close()``. A given directory is kept.
        ndim: See `Storage`.

    Examples:
        >>> import tempfile
        >>> from aiocollect import MemmapStorage, ReplayBuffer
        >>> rb = ReplayBuffer(1_000_000, storage=MemmapStorage(tempfile.mkdtemp()))
    """

    kind = "memmap"
    shareable = True

    def __init__(self, path: str | os.PathLike[str] | None = None, *, ndim: int = 1) -> None:
        super().__init__(ndim=ndim)
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a directory path or None, got {path!r}")
        self._owns_dir = path is None
        self.path = os.fspath(path) if path is not None else ""

    def _allocate(self, layout: Layout) -> dict[Any, torch.Tensor]:
        if not self.path:
            self.path = tempfile.mkdtemp(prefix="aiocollect-buffer-")
        os.makedirs(self.path, exist_ok=True)
        return map_files(self.path, layout)

    def share(self) -> tuple[Any, int | None]:
        return ("memmap", self.path, self._full_layout()), None

    def close(self) -> None:
        super().close()
        if self._owns_dir and self.path:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = ""


def _file_name(i: int, key: Any) -> str:
    name = ".".join(key) if isinstance(key, tuple) else str(key)
    return f"{i:03d}-{name}.bin"


def map_files(path: str, layout: Layout) -> dict[Any, torch.Tensor]:
    """Map (creating as needed) one file per key of ``layout`` in ``path``."""
    out = {}
    for i, (key, shape, dtype) in enumerate(layout):
        count = math.prod(shape)
        file = os.path.join(path, _file_name(i, key))
        t = torch.from_file(file, shared=True, size=count, dtype=dtype) if count else torch.empty(0, dtype=dtype)
        out[key] = t.view(shape)
    return out


def attach_storage(handle: Any, fd: int | None) -> dict[Any, torch.Tensor]:
    """In a worker: map the storage described by a `Storage.share` handle."""
    kind, where, layout = handle
    if kind == "shared":
        assert fd is not None
        block = SharedBlock(where, fd)
        block.close_fd()
        return block.views(layout)
    return map_files(where, layout)


def make_storage(spec: Storage | str | None) -> Storage:
    """Turn the ``storage=`` argument of `ReplayBuffer` into a `Storage`."""
    if spec is None or spec == "memory":
        return MemoryStorage()
    if spec == "shared":
        return SharedMemoryStorage()
    if spec == "memmap":
        return MemmapStorage()
    if isinstance(spec, Storage):
        if spec.built:
            raise ValueError("storage is already in use by another buffer; give each ReplayBuffer its own storage")
        return spec
    raise TypeError(
        "storage must be None, 'memory', 'shared', 'memmap' or a Storage (MemoryStorage, SharedMemoryStorage, "
        f"MemmapStorage), got {spec!r}"
    )

"""Anonymous shared memory (Linux ``memfd``) with typed tensor views.

A block is created by the parent, handed to a worker as a file descriptor (at spawn time or
over the worker's Unix socket), and mapped by both. There is no name in ``/dev/shm`` to leak:
the memory is freed by the kernel when the last mapping and descriptor are gone, even if a
process is killed.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["Layout", "SharedBlock", "layout_nbytes"]

#: One entry per tensor: (key, shape, dtype).
Layout = Sequence[tuple[Any, tuple[int, ...], torch.dtype]]

_ALIGN = 64  # cache-line alignment keeps views of different tensors on separate lines


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def layout_nbytes(layout: Layout) -> int:
    """Bytes one copy of ``layout`` occupies in a block (each tensor aligned)."""
    return sum(_aligned(math.prod(shape) * torch.empty((), dtype=dtype).element_size()) for _, shape, dtype in layout)


class SharedBlock:
    """A shared, anonymous, fixed-size memory block.

    Args:
        size: Size in bytes.
        fd: An existing memfd to map (in the process that receives it); ``None`` creates one.
    """

    def __init__(self, size: int, fd: int | None = None) -> None:
        self.size = max(size, 1)
        if fd is None:
            fd = os.memfd_create("aiocollect", os.MFD_CLOEXEC)
            os.ftruncate(fd, self.size)
        self.fd: int | None = fd
        self._mm = mmap.mmap(fd, self.size)

    def close_fd(self) -> None:
        """Close the descriptor once every process that needs it has its own (the mapping stays)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def views(self, layout: Layout, offset: int = 0) -> dict[Any, torch.Tensor]:
        """Tensor views of ``layout`` starting at byte ``offset``; they keep the mapping alive."""
        out: dict[Any, torch.Tensor] = {}
        for key, shape, dtype in layout:
            count = math.prod(shape)
            itemsize = torch.empty((), dtype=dtype).element_size()
            if count:
                t = torch.frombuffer(self._mm, dtype=dtype, count=count, offset=offset).view(shape)
            else:
                t = torch.empty(shape, dtype=dtype)
            out[key] = t
            offset += _aligned(count * itemsize)
        return out

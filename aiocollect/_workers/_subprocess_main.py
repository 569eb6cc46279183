"""The child side of the subprocess transport: process entry point and `SubprocessChannel`.

Kept apart from the parent side so a worker process imports neither anyio nor the engine:
the forkserver preloads this module, and each worker it forks starts with the loop loaded.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

from ._loop import run_worker
from ._messages import Close, Command, Event
from ._transport import CONTROL_WORDS, WorkerChannel

__all__ = ["FdArg", "SlotsGiven", "SlotsWanted", "SubprocessChannel", "subprocess_main"]

CONTROL_BYTES = 64  # after a worker's slots: its control words (one cache line)


@dataclass(frozen=True)
class SlotsWanted:
    """Start-up, worker -> parent: allocate ``count`` slots of ``layout`` for me."""

    layout: Any
    count: int


@dataclass(frozen=True)
class SlotsGiven:
    """Start-up, parent -> worker: the block's fd follows (``slot_bytes`` per slot)."""

    slot_bytes: int


class FdArg:
    """An fd to duplicate into a child *while it is being spawned* (no helper thread needed)."""

    def __init__(self, fd: Any) -> None:
        self.fd = fd

    def __reduce__(self) -> Any:
        from multiprocessing.reduction import DupFd

        return (FdArg, (None if self.fd is None else DupFd(self.fd),))

    def detach(self) -> int | None:
        """In the child: the duplicated descriptor, now owned by the caller."""
        return self.fd if self.fd is None or isinstance(self.fd, int) else self.fd.detach()


class SubprocessChannel(WorkerChannel):
    """Commands over a Unix socket; slots, control words and weights in memfd blocks."""

    def __init__(self, conn: Any, weights_fd: int | None, weights_bytes: int, weights_layout: Any) -> None:
        self._conn = conn
        self._weights_fd, self._weights_bytes, self._weights_layout = weights_fd, weights_bytes, weights_layout
        self._weights: dict[Any, Any] | None = None
        self.control: Any = None

    def setup(self, spec: Any) -> None:
        import torch

        torch.set_num_threads(spec.num_sub_threads)  # the whole process is this worker's

    def receive(self) -> Command:
        return self._conn.recv()

    def send(self, event: Event) -> None:
        self._conn.send(event)

    def output_slots(self, layout: Any, count: int) -> list[dict[Any, Any]]:
        from multiprocessing.reduction import recv_handle

        import torch

        from .._core._shm import SharedBlock

        self._conn.send(SlotsWanted(layout, count))
        msg = self._conn.recv()
        if isinstance(msg, Close):
            return []
        if not isinstance(msg, SlotsGiven):  # pragma: no cover - a protocol bug
            raise RuntimeError(f"worker expected its slots during start-up, got {msg!r}")
        size = msg.slot_bytes
        block = SharedBlock(count * size + CONTROL_BYTES, recv_handle(self._conn))
        block.close_fd()
        # A numpy view: polled before every env step, so reading it must cost next to nothing.
        words = [("control", (CONTROL_WORDS,), torch.int64)]
        self.control = block.views(words, count * size)["control"].numpy()
        return [block.views(layout, i * size) for i in range(count)]

    def weights(self) -> dict[Any, Any]:
        if self._weights is None:
            from .._core._shm import SharedBlock

            if self._weights_fd is None:  # pragma: no cover - the engine only syncs nn.Module policies
                raise RuntimeError("this worker was started without a weight block")
            block = SharedBlock(self._weights_bytes, self._weights_fd)
            block.close_fd()
            self._weights_fd = None
            self._weights = block.views(self._weights_layout)
        return self._weights

    def storage(self, handle: Any) -> dict[Any, Any]:
        from multiprocessing.reduction import recv_handle

        from .._buffer._storage import attach_storage

        info, has_fd = handle  # the descriptor itself follows the command
        return attach_storage(info, recv_handle(self._conn) if has_fd else None)


def _watch_parent(alive: Any) -> None:
    # The parent holds the other end; EOF means it died (even by SIGKILL): exit at once.
    try:
        alive.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(1)


def subprocess_main(
    conn: Any, alive: Any, spec_bytes: bytes, weights_fd: FdArg, weights_bytes: int, weights_layout: Any
) -> None:
    """Entry point of a worker process (module level, so ``spawn`` and ``forkserver`` can import it)."""
    # Ctrl-C goes to the whole process group; the parent decides how workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(alive,), name="aiocollect parent watcher", daemon=True).start()
    run_worker(SubprocessChannel(conn, weights_fd.detach(), weights_bytes, weights_layout), spec_bytes)
    # Skip interpreter teardown (seconds with torch loaded): nothing is left to flush but stdio.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

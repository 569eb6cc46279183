"""The child side of the subprocess transport: process entry point and `SubprocessChannel`.

Kept apart from the parent side so a worker process imports neither anyio nor the engine:
the forkserver preloads this module, and each worker it forks starts with the loop loaded.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._launch_group import (
    die_with_group,
    end_group_but_self,
    hide_from_forked_children,
    lead_new_group,
    may_start_processes,
)
from ._loop import run_worker
from ._messages import Close, Command, Event
from ._transport import CONTROL_WORDS, Tensors, WorkerChannel

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

    def __init__(self, conn: Any, weights_fd: int | None, weights_layout: Any) -> None:
        self._conn = conn
        self._weights_fd, self._weights_layout = weights_fd, weights_layout
        self._weights: Any = None  # the WeightBlock, mapped at the first update
        self.control: Any = None
        self.parent_lost = False  # the socket broke: the parent died (or dropped this worker)

    def setup(self, spec: Any) -> None:
        import torch

        torch.set_num_threads(spec.num_sub_threads)  # the whole process is this worker's

    def receive(self) -> Command:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self.parent_lost = True
            raise

    def send(self, event: Event) -> None:
        try:
            self._conn.send(event)
        except OSError:
            self.parent_lost = True
            raise

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

    def read_weights(self, into: Callable[[Tensors], None], have: int | None = None) -> int | None:
        if self._weights is None:
            from ._weights import WeightBlock

            if self._weights_fd is None:  # pragma: no cover - the engine only syncs nn.Module policies
                raise RuntimeError("this worker was started without a weight block")
            self._weights = WeightBlock(self._weights_layout, self._weights_fd)
            self._weights.close()
            self._weights_fd = None
        return self._weights.read(into, have)

    def storage(self, handle: Any) -> dict[Any, Any]:
        from multiprocessing.reduction import recv_handle

        from .._buffer._storage import attach_storage

        info, has_fd = handle  # the descriptor itself follows the command
        return attach_storage(info, recv_handle(self._conn) if has_fd else None)


def _parent_gone(alive: Any) -> bool:
    # The parent never writes to it: readable means EOF.
    try:
        return bool(alive.poll())
    except (EOFError, OSError):
        return True


def _watch_parent(alive: Any, leader: bool) -> None:
    # The parent holds the other end; EOF means it died (even by SIGKILL): exit at once, and
    # take the env's own processes along (a ParallelEnv's workers would otherwise run on).
    try:
        alive.recv_bytes()
    except (EOFError, OSError):
        pass
    die_with_group(leader)


def subprocess_main(conn: Any, alive: Any, spec_bytes: bytes, weights_fd: FdArg, weights_layout: Any) -> None:
    """Entry point of a worker process (module level, so ``spawn`` and ``forkserver`` can import it)."""
    # Its own session, so its own process group: whatever the env starts joins it, and the
    # parent can end them all together (see _launch_group).
    leader = lead_new_group()
    # Ctrl-C goes to the terminal's foreground group (no longer this one, unless setsid
    # failed); the parent decides how workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    may_start_processes()
    hide_from_forked_children([conn.fileno(), alive.fileno()])
    threading.Thread(target=_watch_parent, args=(alive, leader), name="aiocollect parent watcher", daemon=True).start()
    channel = SubprocessChannel(conn, weights_fd.detach(), weights_layout)
    run_worker(channel, spec_bytes)
    # Skip interpreter teardown (seconds with torch loaded): nothing is left to flush but stdio.
    sys.stdout.flush()
    sys.stderr.flush()
    # What the env left running ends with this process. The parent also sweeps the group once
    # it has seen this process end, but a dead parent cannot, and the watcher thread may not
    # get to it before the exit below.
    if channel.parent_lost or _parent_gone(alive):
        die_with_group(leader)
    end_group_but_self()
    os._exit(0)

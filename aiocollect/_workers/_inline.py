"""The inline transport: each worker is a thread of this process.

It is the reference implementation of the seam, and what most multi-collector tests run on,
so they do not spawn. A worker gets its own copy of the policy (its `WorkerSpec` goes through
cloudpickle, exactly as for a process), collects into ordinary tensors and writes a replay
buffer's rows itself, whatever the storage. Commands reach it through a queue; its events
go into a deque, and a byte written to its own wake-up pipe tells the event loop to look,
so waiting for workers is the same file-descriptor wait as for processes, on any loop.

What a thread cannot do: be killed. `kill` is unavailable (``can_kill`` is False), so a
worker stuck in its env fails with `WorkerTimeoutError` instead of being restarted, and a
worker that ignores `Close` past the deadline is left behind as a daemon thread.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from .._core._errors import WorkerCrashedError, worker_error_from_message
from ._loop import run_worker
from ._messages import Close, Command, Event, Exited, Failed, Ready
from ._transport import (
    BUSY,
    CONTROL_WORDS,
    PREEMPT,
    PROGRESS,
    STOP,
    Tensors,
    Transport,
    WorkerChannel,
)

__all__ = ["InlineTransport", "transport_class"]


class _Inbox:
    """One worker's event deque and wake-up pipe (closed once, under its lock)."""

    def __init__(self) -> None:
        self.events: deque[Event] = deque()
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)
        self.lock = threading.Lock()
        self.closed = False

    def put(self, event: Event) -> None:
        with self.lock:
            if self.closed:
                return  # the engine let go of this worker: nothing reads its events any more
            self.events.append(event)
            try:
                os.write(self.wfd, b"\0")
            except BlockingIOError:
                pass  # the pipe is full of wake-ups already; the reader drains the deque

    def drain(self) -> None:
        try:
            os.read(self.rfd, 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                os.close(self.rfd)
                os.close(self.wfd)


class _InlineChannel(WorkerChannel):
    def __init__(self, transport: InlineTransport, w: int, inbox: _Inbox) -> None:
        self._transport, self._w, self._inbox = transport, w, inbox
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.control = np.zeros(CONTROL_WORDS, dtype=np.int64)
        self.slots: list[dict[Any, Any]] = []

    def receive(self) -> Command:
        return self.commands.get()

    def send(self, event: Event) -> None:
        self._inbox.put(event)

    def output_slots(self, layout: Any, count: int) -> list[dict[Any, Any]]:
        import torch

        self.slots = [{k: torch.zeros(shape, dtype=dtype) for k, shape, dtype in layout} for _ in range(count)]
        return [] if self.control[STOP] else self.slots

    def read_weights(self, into: Callable[[Tensors], None], have: int | None = None) -> int | None:
        version, state = self._transport._weights  # one tuple: a version and its own copy
        if version != have:
            into(state)
        return version

    def storage(self, handle: Any) -> dict[Any, Any]:
        return handle.tensors


def _thread_main(channel: _InlineChannel, spec: bytes, inbox: _Inbox) -> None:
    try:
        run_worker(channel, spec)
    finally:
        inbox.put(Exited(0))


class InlineTransport(Transport):
    """Workers as threads of this process (no options)."""

    memory = "process"
    can_kill = False
    versioned_weights = True  # each version is a fresh copy, read whole

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        given = {k: v for k, v in options.items() if v is not None}
        if given:
            raise ValueError(f"the inline backend runs workers as threads and takes no options, got {given!r}")
        return {}

    def __init__(self, num_workers: int, options: dict[str, Any], weights_layout: Any) -> None:
        super().__init__(num_workers, options, weights_layout)
        self._channels: list[_InlineChannel | None] = [None] * num_workers
        self._inboxes: list[_Inbox | None] = [None] * num_workers
        self._threads: list[threading.Thread | None] = [None] * num_workers
        self._weights: tuple[int | None, Tensors] = (None, {})

    # -- life --------------------------------------------------------------------------------
    async def start(self, w: int, spec: bytes) -> Any:
        inbox = _Inbox()
        channel = _InlineChannel(self, w, inbox)
        thread = threading.Thread(
            target=_thread_main, args=(channel, spec, inbox), name=f"aiocollect-inline-worker-{w}", daemon=True
        )
        self._channels[w], self._inboxes[w], self._threads[w] = channel, inbox, thread
        thread.start()
        while True:
            for _, event in await self.receive([w]):
                if isinstance(event, Ready):
                    return event.layout
                if isinstance(event, Failed):
                    raise worker_error_from_message(w, os.getpid(), event)
                if isinstance(event, Exited):
                    raise WorkerCrashedError(w, os.getpid(), event.exitcode, during_startup=True)

    async def stop(self, w: int, timeout: float) -> None:
        channel, thread, inbox = self._channels[w], self._threads[w], self._inboxes[w]
        if channel is None:
            return
        channel.control[STOP] = 1
        channel.commands.put(Close())
        self._channels[w] = self._threads[w] = self._inboxes[w] = None
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join, timeout, abandon_on_cancel=True)
        if inbox is not None:
            with inbox.lock:
                self._keep_close_failure(w, os.getpid(), list(inbox.events))
            inbox.close()

    def stop_nowait(self) -> None:
        for channel in self._channels:
            if channel is not None:
                channel.control[STOP] = 1

    def close_now(self) -> None:
        for w, channel in enumerate(self._channels):
            if channel is not None:
                channel.control[STOP] = 1
                channel.commands.put(Close())
            inbox = self._inboxes[w]
            if inbox is not None:
                inbox.close()
        self._channels = [None] * self.num_workers
        self._inboxes = [None] * self.num_workers
        self._threads = [None] * self.num_workers

    # -- commands and events -----------------------------------------------------------------
    def send(self, w: int, command: Command) -> None:
        channel = self._channels[w]
        if channel is not None:
            channel.commands.put(command)

    def receive_nowait(self, workers: list[int]) -> list[tuple[int, Event]]:
        got: list[tuple[int, Event]] = []
        for w in workers:
            inbox = self._inboxes[w]
            if inbox is None:
                got.append((w, Exited(None)))
                continue
            while inbox.events:
                got.append((w, inbox.events.popleft()))
        return got

    async def receive(self, workers: list[int]) -> list[tuple[int, Event]]:
        while True:
            # Drain the wake-ups first: an event put after this check writes a new byte.
            for w in workers:
                inbox = self._inboxes[w]
                if inbox is not None:
                    inbox.drain()
            got = self.receive_nowait(workers)
            if got or not workers:
                return got

            async def one(fd: int, scope: anyio.CancelScope) -> None:
                await anyio.wait_readable(fd)
                scope.cancel()

            async with anyio.create_task_group() as tg:
                for w in workers:
                    tg.start_soon(one, self._inboxes[w].rfd, tg.cancel_scope)  # type: ignore[union-attr]

    # -- data --------------------------------------------------------------------------------
    def batch(self, w: int, slot: int) -> Tensors:
        return self._channels[w].slots[slot]  # type: ignore[union-attr]

    def publish_weights(self, state: Tensors, version: int) -> None:
        # A copy: the caller may go on training its module while workers load this version.
        self._weights = (version, {k: v.detach().clone() for k, v in state.items()})

    def attach_storage(self, w: int, storage: Any) -> None:
        from ._messages import AttachStorage

        self.send(w, AttachStorage(storage))

    # -- control words -----------------------------------------------------------------------
    def preempt(self, w: int, seq: int) -> None:
        channel = self._channels[w]
        if channel is not None:
            channel.control[PREEMPT] = seq

    def progress(self, w: int) -> tuple[int, bool] | None:
        channel = self._channels[w]
        return None if channel is None else (int(channel.control[PROGRESS]), bool(channel.control[BUSY]))

    def pid(self, w: int) -> int | None:
        return os.getpid()

    def kill(self, w: int) -> None:
        raise NotImplementedError("a worker thread cannot be killed")


transport_class = InlineTransport

"""The node side of request/response transports (torch RPC, Ray): `NodeHost` and its channel.

Engines such as torch RPC and Ray move data as the return values of remote calls; neither
gives a node a connection of its own to write to. So a node is hosted by a `NodeHost`
object on the remote side (a module-level registry entry under RPC, an actor under Ray)
that runs the same worker loop as every other transport (``_dist._node.run_node`` for a
collection node) in a thread, behind a `WorkerChannel`, and exposes three calls:

* `NodeHost.push`: the trainer's commands, numbered. Remote calls may run concurrently on
  the node (RPC's thread pool, a threaded actor), so they are put back in order here.
* `NodeHost.poll`: a long poll. It returns the node's events (a finished batch travels with
  its `BatchReady`, as the call's return value), its progress count and busy flag, and
  whether the worker loop has ended. It returns as soon as there is an event, when the
  progress changed and ``beat`` seconds passed, or after ``idle`` seconds; the trainer keeps
  one poll per node in flight, so a node that dies fails that call at once, and one that
  stops answering goes silent for the engine's liveness rule.
* `NodeHost.stop`: the start of shutdown: the batch in progress ends at its next env step.

Imports neither anyio nor the engine, nor the remote engine itself.
"""

from __future__ import annotations

import importlib
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._messages import ApplyWeights, BatchReady, Close, Command, Event
from ._prestart import remove_temp_dir_before_kill
from ._transport import BUSY, CONTROL_WORDS, PROGRESS, STOP, Tensors, WorkerChannel

__all__ = ["HostSetup", "NodeHost", "PollResult"]


@dataclass(frozen=True)
class HostSetup:
    """What a `NodeHost` runs: the worker loop (``module:function``) and its cloudpickled spec."""

    worker_main: str
    spec: bytes
    weights: dict[Any, Any] | None  # the published weights, when the node must start from them
    beat: float  # seconds between progress reports while the count changes
    idle: float = 10.0  # a poll returns after this long even when nothing changed
    killed_after: bool = False  # the host's process is killed once the loop has ended (a Ray actor)


@dataclass(frozen=True)
class PollResult:
    """What one poll returns: events (a `BatchReady` paired with its tensors), progress, end."""

    events: list[tuple[Event, dict[Any, Any] | None]]
    progress: int
    busy: bool
    finished: bool


class _HostChannel(WorkerChannel):
    def __init__(self, weights: dict[Any, Any] | None) -> None:
        self.control = np.zeros(CONTROL_WORDS, dtype=np.int64)
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._events: list[tuple[Event, dict[Any, Any] | None]] = []
        self._slots: list[dict[Any, Any]] = []
        self._weights: tuple[int | None, Any] = (None, weights or {})
        self._activity: Callable[[], int] | None = None
        self._interrupt: Callable[[], None] | None = None

    # -- WorkerChannel -----------------------------------------------------------------------
    def receive(self) -> Command:
        return self._commands.get()

    def send(self, event: Event) -> None:
        self._post(event, None)

    def output_slots(self, layout: Any, count: int) -> list[dict[Any, Any]]:
        import torch

        self._slots = [{k: torch.empty(shape, dtype=dtype) for k, shape, dtype in layout} for _ in range(count)]
        return self._slots

    def read_weights(self, into: Callable[[Tensors], None], have: int | None = None) -> int | None:
        version, weights = self._weights  # queued ahead of the commands: maybe newer than the one handled
        into(weights)
        return version

    def storage(self, handle: Any) -> dict[Any, Any]:
        raise RuntimeError("remote nodes cannot write into the trainer's replay buffer")

    def attach_runner(self, activity: Callable[[], int], interrupt: Callable[[], None]) -> None:
        self._activity, self._interrupt = activity, interrupt
        if self.control[STOP]:
            interrupt()

    def batch_ready(self, slot: int) -> None:
        # A copy: the reply is serialized after this returns, and the slot is written again as
        # soon as the next Collect for it arrives.
        self._post(BatchReady(slot), {k: v.clone() for k, v in self._slots[slot].items()})

    # -- the host's side -----------------------------------------------------------------------
    def _post(self, event: Event, tensors: dict[Any, Any] | None) -> None:
        with self._cond:
            self._events.append((event, tensors))
            self._cond.notify_all()

    def progress(self) -> int:
        count = int(self.control[PROGRESS])
        activity = self._activity
        if activity is not None:
            try:
                count += activity()
            except Exception:  # a runner being torn down: its count no longer matters
                pass
        return count

    def stop(self) -> None:
        self.control[STOP] = 1
        interrupt = self._interrupt
        if interrupt is not None:
            interrupt()


class NodeHost:
    """Hosts one node's worker loop on the remote side; every method is a remote call's body.

    Args:
        setup: What to run (`HostSetup`).
    """

    def __init__(self, setup: HostSetup) -> None:
        self._setup = setup
        self._channel = _HostChannel(setup.weights)
        self._next_seq = 0
        self._early: dict[int, tuple[Command, Any]] = {}  # commands that overtook an earlier one
        self._order = threading.Lock()
        self._reported = (-1, False)
        self._last_poll = 0.0
        self._finished = threading.Event()
        module, _, name = setup.worker_main.partition(":")
        main = getattr(importlib.import_module(module), name)
        self._thread = threading.Thread(target=self._run, args=(main,), name="aiocollect-node", daemon=True)
        self._thread.start()

    def _run(self, main: Callable[[WorkerChannel, bytes], None]) -> None:
        try:
            main(self._channel, self._setup.spec)
        finally:
            try:
                if self._setup.killed_after:  # before the trainer can see the end (and kill us)
                    remove_temp_dir_before_kill()
            finally:
                self._finished.set()
            with self._channel._cond:
                self._channel._cond.notify_all()

    def info(self) -> tuple[int, str, str]:
        """``(pid, hostname, address)`` of the process the node runs in."""
        hostname = socket.gethostname()
        try:
            address = socket.gethostbyname(hostname)
        except OSError:
            address = "unknown address"
        return os.getpid(), hostname, address

    def push(self, seq: int, command: Command, weights: Any = None) -> None:
        """Queue command number ``seq`` (with the weights an `ApplyWeights` carries), in order."""
        with self._order:
            self._early[seq] = (command, weights)
            while self._next_seq in self._early:
                cmd, w = self._early.pop(self._next_seq)
                self._next_seq += 1
                if isinstance(cmd, ApplyWeights) and w is not None:
                    # The newest wins (every update is a whole state), and says which it is.
                    self._channel._weights = (cmd.version, w)
                self._channel._commands.put(cmd)

    def poll(self) -> PollResult:
        """Wait for events, a progress change (at most every ``beat`` seconds) or ``idle`` seconds."""
        ch, setup = self._channel, self._setup
        start = time.monotonic()
        beat_at, deadline = max(start, self._last_poll + setup.beat), start + setup.idle
        with ch._cond:
            while True:
                now = (ch.progress(), bool(ch.control[BUSY]))
                t = time.monotonic()
                if ch._events or self._finished.is_set() or t >= deadline:
                    break
                if now != self._reported and t >= beat_at:
                    break
                ch._cond.wait(min(deadline, beat_at if t < beat_at else t + setup.beat) - t)
            # Read before taking the events: every event is posted before the loop ends.
            finished = self._finished.is_set()
            events, ch._events = ch._events, []
        self._reported, self._last_poll = now, time.monotonic()
        return PollResult(events, now[0], now[1], finished)

    def stop(self) -> None:
        """End the batch in progress at its next env step, and collect nothing more."""
        self._channel.stop()

    def close(self, timeout: float) -> bool:
        """Stop, close and wait up to ``timeout`` for the worker loop to end; True if it did."""
        self._channel.stop()
        self._channel._commands.put(Close())  # out of order on purpose: nothing else matters now
        self._thread.join(timeout)
        return not self._thread.is_alive()

"""Weight updates inside a worker: applying them, and letting them overtake queued collects.

A `MultiAsyncCollector` keeps two `Collect` requests queued per worker (one being collected,
one waiting), and commands are handled in order. A weight update sent while both are queued
would reach the worker only after two more batches with the old weights. So the engine, right
after sending an update, raises a signal in the worker's ``PREEMPT`` control word: ``-version``
(a negative value never names a request, whose numbers are positive). Before starting a
`Collect`, the worker looks at that word: if it names a version newer than its own, the update
is already in its command channel (it was sent before the signal), so the worker reads up to
it and applies it first. An update overtakes only the `Collect` requests queued right before
it, never another command, and never a batch in progress: no batch mixes two versions, and
no batch starts with weights older than the newest the engine sent.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ._messages import ApplyWeights, Close, Collect, Command, LoadWeights, WeightsApplied
from ._transport import PREEMPT, WorkerChannel

__all__ = ["CommandQueue", "apply_weights", "restore_version", "weights_signal"]

WeightCommand = ApplyWeights | LoadWeights


def weights_signal(version: int) -> int:
    """The ``PREEMPT`` word that says "version ``version`` waits in your command channel"."""
    return -version


class CommandQueue:
    """A worker's commands in the order it handles them (see the module docstring)."""

    def __init__(self, channel: WorkerChannel) -> None:
        self.channel = channel
        self.backlog: deque[Command] = deque()

    def next(self, version: int) -> Command:
        """The next command to handle, for a worker whose weights are version ``version``."""
        cmd = self.backlog.popleft() if self.backlog else self.channel.receive()
        if isinstance(cmd, Collect) and -int(self.channel.control[PREEMPT]) > version:
            cmd = self._overtake(cmd, -int(self.channel.control[PREEMPT]))
        return cmd

    def _overtake(self, first: Collect, version: int) -> Command:
        pending: list[Command] = [first, *self.backlog]
        self.backlog.clear()
        # The engine sent the update before raising the signal: it is in the channel already.
        while not any(isinstance(c, WeightCommand) and c.version >= version for c in pending):
            cmd = self.channel.receive()
            pending.append(cmd)
            if isinstance(cmd, Close):
                break  # shutting down: nothing more will come
        order: list[Command] = []
        for cmd in pending:
            at = len(order)
            if isinstance(cmd, WeightCommand):
                while at and isinstance(order[at - 1], Collect):
                    at -= 1  # past the collects queued right before it, and nothing else
            order.insert(at, cmd)
        self.backlog.extend(order[1:])
        return order[0]


def apply_weights(rollout: Any, channel: WorkerChannel, cmd: WeightCommand) -> None:
    """Load the weights ``cmd`` names into the worker's policy, take its version, acknowledge."""
    from ._weights import load_into, unpack_state

    adapter = rollout.policy
    version = cmd.version
    with adapter.lock:  # never in the middle of a policy call
        if isinstance(cmd, ApplyWeights):
            # The store may already hold a newer version than the command names (the engine
            # published again while this worker finished its batch): that one is loaded, and
            # frames say so.
            got = channel.read_weights(lambda state: load_into(adapter.policy, state), adapter.version)
            version = version if got is None else max(version, got)
        elif cmd.payload is not None:
            load_into(adapter.policy, unpack_state(cmd.payload))
        adapter.version = version
    if isinstance(cmd, LoadWeights) and cmd.restore:
        restore_version(rollout, version)
    else:
        applied = getattr(rollout, "weights_applied", None)
        if applied is not None:  # a PolicyVersion transform on a TorchRL env moves on
            applied()
    channel.send(WeightsApplied(version))


def restore_version(rollout: Any, version: int) -> None:
    """Set a ``PolicyVersion`` transform on the rollout's TorchRL env (if any) to ``version``."""
    tracker = getattr(getattr(rollout, "env", None), "version_tracker", None)
    if tracker is not None and getattr(tracker, "version_type", int) in (int, "int"):
        tracker.version = version

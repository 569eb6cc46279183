"""Everything that crosses the seam between the engine and a worker, as typed records.

Commands go from the engine to a worker, events from a worker (or its transport) back. Every
transport carries these same records, so the worker loop and the engine never depend on how
they travel. They are small: tensors never ride in a message. A batch lives in an output slot
(shared memory, or tensors the transport ships), and weights live in the transport's weight
store; only `LoadWeights` carries a packed copy (one worker's own weights, or weights whose
layout the engine does not know because the policy exists only in the workers).

The start-up handshake is: the transport starts the worker with a `WorkerSpec`; the worker
builds its env and policy, gets its output slots from the transport, and sends `Ready`. After
that it handles one command at a time, in order, between batches. A weight update therefore
never lands in the middle of a batch; it may overtake the `Collect` requests queued right
before it (see ``_loop``), so no batch is started with weights older than the newest sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from .._rollout._config import CollectorConfig

__all__ = [
    "ApplyWeights",
    "AttachStorage",
    "BatchReady",
    "Close",
    "Collect",
    "Command",
    "Event",
    "Exited",
    "Failed",
    "LoadWeights",
    "Ready",
    "RemoteCall",
    "Reply",
    "Reset",
    "Seed",
    "SetHook",
    "WeightsApplied",
    "WorkerSpec",
]

#: Rows of a replay buffer's storage: ``(first_row, count)`` runs, in order.
Pieces = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is built from: sent once, at start (cloudpickled; factories may be lambdas).

    The policy travels by value with the weights it has when the worker starts. Only later
    updates go through the transport's weight store.
    """

    worker_id: int
    num_workers: int
    collector: CollectorConfig  # validated, for this worker: env factory, devices, batch size
    policy: Any  # an nn.Module, a callable, or None (random actions)
    policy_factory: Callable[[], Any] | None  # builds the policy in the worker instead
    num_sub_threads: int  # torch threads in the worker
    policy_version: int
    load_weights: bool  # start from the transport's published weights, not the pickled ones
    seed: np.random.SeedSequence | None
    traj_start: int  # first trajectory id; a restarted worker moves to a fresh range
    preemptible: bool  # poll the preempt word every step (MultiSync's preemptive_threshold)
    pre_collect_hook: Callable[[], Any] | None = None  # called before each batch
    post_collect_hook: Callable[[Any], Any] | None = None  # called with each batch before it is handed over
    profiler: Any = None  # a ProfilerHook (enable_profile), run after post_collect_hook
    weights: bytes | None = None  # this worker's own weights (packed), loaded after the published ones


# -- commands: engine -> worker ----------------------------------------------------------------
@dataclass(frozen=True)
class Collect:
    """Fill output slot ``slot`` (or, with ``pieces``, those rows of the attached storage)."""

    slot: int
    random: bool  # random actions (init_random_frames)
    seq: int  # the request's number; the preempt word names the request to cut short
    pieces: Pieces | None = None


@dataclass(frozen=True)
class ApplyWeights:
    """Load the weights now in the transport's weight store; they are version ``version``."""

    version: int


@dataclass(frozen=True)
class LoadWeights:
    """Load the weights this command carries: this worker's own, or ones the shared store cannot hold.

    ``payload`` is a pickled state dict of CPU tensors (``None``: keep the weights, only take
    ``version``). ``restore``: a saved state is being restored, so a ``PolicyVersion`` transform
    on the env is set to ``version`` instead of moving on by one. Answered by `WeightsApplied`.
    """

    version: int
    payload: bytes | None
    restore: bool = False


@dataclass(frozen=True)
class AttachStorage:
    """Write batches straight into a replay buffer's storage from now on.

    ``handle`` is whatever the transport needs to reach it from the worker (a `Storage.share`
    handle for another process, the tensors themselves in the same process).
    """

    handle: Any


@dataclass(frozen=True)
class Seed:
    """Re-seed the worker's RNGs and reset its envs with seeds drawn from ``seeds``."""

    seeds: np.random.SeedSequence


@dataclass(frozen=True)
class Reset:
    """Reset every env (fresh trajectory ids) before the next batch."""


@dataclass(frozen=True)
class RemoteCall:
    """Read an attribute path of the worker (``map_fn``, ``get_distant_attr``), answered by `Reply`.

    ``request`` is cloudpickled ``(path, args, kwargs)``: the path is resolved on the worker's
    `WorkerView`, then called with ``args``/``kwargs``, or read as is if ``args`` is None.
    """

    seq: int
    request: bytes


@dataclass(frozen=True)
class SetHook:
    """Replace hook ``name`` (``pre_collect_hook``, ``post_collect_hook`` or ``profiler``) from the next batch on.

    ``hook`` is the new hook (``None`` removes it), cloudpickled; a profiler that is
    replaced is stopped (its trace written).
    """

    name: str
    hook: bytes


@dataclass(frozen=True)
class Close:
    """Stop after the current command; close the env."""


Command = Collect | ApplyWeights | LoadWeights | AttachStorage | Seed | Reset | RemoteCall | SetHook | Close


# -- events: worker (or transport) -> engine ----------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """Start-up finished: env and policy built, output slots in place."""

    pid: int | None
    layout: Any  # of one output slot: [(key, shape, dtype)], shapes [*env_batch, T, ...]


@dataclass(frozen=True)
class BatchReady:
    """Output slot ``slot`` (or the storage rows of that request) holds a finished batch.

    A batch with no fixed layout (`BatchLayout.pickled`) travels in ``payload`` instead, pickled.
    """

    slot: int
    payload: bytes | None = None


@dataclass(frozen=True)
class WeightsApplied:
    """The worker now collects with policy version ``version``."""

    version: int


@dataclass(frozen=True)
class Failed:
    """The worker raised: it stops, and the engine re-raises this as a `WorkerError`."""

    step: int | None  # env steps done when it failed (None: during start-up)
    exception: bytes | None  # the pickled exception, or None if it could not be pickled
    summary: str  # "ValueError: message"
    traceback: str  # the worker's formatted traceback


@dataclass(frozen=True)
class Reply:
    """The answer to `RemoteCall` ``seq``: the cloudpickled ``value``, or the exception it raised.

    A call that raised leaves the worker running: ``exception`` is the pickled exception (or
    None if it cannot be pickled), with its ``summary`` and the worker's ``traceback``.
    """

    seq: int
    value: bytes | None
    exception: bytes | None = None
    summary: str = ""
    traceback: str = ""


@dataclass(frozen=True)
class Exited:
    """The worker is gone (sent by the transport; ``exitcode`` is None if unknown)."""

    exitcode: int | None


Event = Ready | BatchReady | WeightsApplied | Reply | Failed | Exited

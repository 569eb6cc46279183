"""The seam between the collector engine and its workers: `Transport` and `WorkerChannel`.

The engine (``_multi._engine``) drives workers only through a `Transport`; the worker loop
(``_loop``) talks to the engine only through a `WorkerChannel`. Everything that depends on
where a worker runs lives behind these two classes: how it is started and stopped, where
its output slots are, how weights reach it, how it is told to cut a batch short, and how
the engine learns that it is alive, finished a batch, or died.

A new transport (torch.distributed, Ray, ...) is one module in this package that subclasses
both and ends with ``transport_class = ...``; see ``docs/workers.md``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal

from ._messages import Command, Event, Failed

__all__ = ["BUSY", "CONTROL_WORDS", "PREEMPT", "PROGRESS", "STOP", "Transport", "WorkerChannel"]

# A worker's control words: four int64s that the engine and the worker both see. The engine
# writes PREEMPT (the sequence number of a request to cut short) and STOP (cut any batch
# short: shutdown); the worker bumps PROGRESS at every env step and command, and holds BUSY
# while it has work. Polled every step, so they are plain memory, never a message.
PREEMPT, STOP, PROGRESS, BUSY = range(4)
CONTROL_WORDS = 4

#: Tensors by key: one output slot, a storage's columns, or a policy's state dict.
Tensors = Mapping[Any, Any]


class Transport(ABC):
    """Starts, feeds, watches and stops the workers of one collector.

    One instance per collector, created when it starts. Every method is called from the
    collector's event loop. ``w`` is a worker index in ``range(num_workers)``. A worker is
    *started* between a successful `start` and the next `stop`; commands to a worker that is
    not started are dropped (its exit is reported as an event instead).

    Class attributes describe what the engine may rely on:

    * ``memory``: where workers can write a replay buffer's rows themselves. ``"process"``:
      any storage, it is in their process. ``"host"``: storages that are shareable between
      processes (`SharedMemoryStorage`, `MemmapStorage`). ``"none"``: the engine writes.
    * ``can_kill``: `kill` really stops a hung worker (a thread cannot be killed).
    * ``versioned_weights``: publishing a version never disturbs a worker still loading an
      older one, and each worker learns from the store which version it loaded
      (`WorkerChannel.read_weights` returns it). Otherwise the engine publishes a version only
      once every worker has acknowledged the last one.
    """

    memory: ClassVar[Literal["process", "host", "none"]]
    can_kill: ClassVar[bool]
    versioned_weights: ClassVar[bool] = False

    @classmethod
    @abstractmethod
    def check_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """Validate this transport's options (start method, addresses, ...) before anything starts.

        Returns:
            The options with defaults filled in.

        Raises:
            TypeError, ValueError: An option is wrong; the message says which and how to fix it.
        """

    @classmethod
    def forks_from_server(cls, options: Mapping[str, Any]) -> bool:
        """Whether workers started with ``options`` (from `check_options`) fork from this process's fork server.

        A distributed node whose collector's workers do forks that server from itself at its
        start (`fork_forkserver`) instead of paying a new interpreter's imports.
        """
        return False

    def __init__(self, num_workers: int, options: dict[str, Any], weights_layout: Any) -> None:
        """Prepare (not start) ``num_workers`` workers.

        ``options`` come from `check_options`; ``weights_layout`` describes the policy's state
        dict as ``[(key, shape, dtype)]`` (``None``: the policy has no weights to sync).
        """
        self.num_workers, self.options, self.weights_layout = num_workers, options, weights_layout
        #: Workers that failed while stopping (their env's ``close()`` raised), read by the engine
        #: once every worker is stopped: ``{worker: (pid, Failed)}``.
        self.close_failures: dict[int, tuple[int | None, Failed]] = {}

    def adopt_weights_layout(self, layout: Any) -> None:
        """Take the weights' layout after the workers started (it was ``None``: a ``policy_factory``).

        Transports whose workers receive weights into buffers laid out at start tell each worker
        before its next weights; the others need nothing more.
        """
        self.weights_layout = layout

    def _keep_close_failure(self, w: int, pid: int | None, events: Iterable[Event]) -> None:
        """Keep the first `Failed` among ``events``, what worker ``w`` sent after being told to close."""
        for event in events:
            if isinstance(event, Failed):
                self.close_failures.setdefault(w, (pid, event))
                return

    # -- life --------------------------------------------------------------------------------
    @abstractmethod
    async def start(self, w: int, spec: bytes) -> Any:
        """Start worker ``w`` from its cloudpickled `WorkerSpec` and wait until it is `Ready`.

        Returns:
            The layout of its output slots (``[(key, shape, dtype)]``, from `Ready`).

        Raises:
            WorkerError: The worker failed while starting (with its traceback).
            WorkerCrashedError: It died while starting.
        """

    @abstractmethod
    async def stop(self, w: int, timeout: float) -> None:
        """Stop worker ``w`` (ask, then force after ``timeout``) and free what it holds.

        Idempotent. After it returns no event of that worker is delivered any more, so a
        worker can be restarted with `start`. A `Failed` the worker sent after `Close` (its
        env's ``close()`` raised) is kept with `_keep_close_failure`, for the engine to raise.
        """

    @abstractmethod
    def stop_nowait(self) -> None:
        """Tell every worker to cut its batch short and close (the start of shutdown)."""

    @abstractmethod
    def close_now(self) -> None:
        """Free everything at once, synchronously (garbage collection of an unclosed collector)."""

    async def aclose(self, timeout: float) -> None:
        """Stop every worker (each gets ``timeout``, all together at most three times that), then free all."""
        import anyio

        self.stop_nowait()
        with anyio.move_on_after(timeout * 3):
            async with anyio.create_task_group() as tg:
                for w in range(self.num_workers):
                    tg.start_soon(self.stop, w, timeout)
        self.close_now()

    # -- commands and events -----------------------------------------------------------------
    @abstractmethod
    def send(self, w: int, command: Command) -> None:
        """Send one command to worker ``w`` (never blocks for long: commands are small)."""

    @abstractmethod
    def receive_nowait(self, workers: list[int]) -> list[tuple[int, Event]]:
        """Events of ``workers`` that already arrived, oldest first, as ``(worker, event)`` pairs."""

    @abstractmethod
    async def receive(self, workers: list[int]) -> list[tuple[int, Event]]:
        """Wait until at least one of ``workers`` sends an event, without blocking the loop.

        A worker that dies produces `Exited` here. Cancellation loses nothing: an event is
        only taken off its channel together with being returned.
        """

    # -- data --------------------------------------------------------------------------------
    @abstractmethod
    def batch(self, w: int, slot: int) -> Tensors:
        """The finished batch in worker ``w``'s output ``slot``, as tensors (valid until the
        slot is asked to collect again: copy what you keep)."""

    @abstractmethod
    def publish_weights(self, state: Tensors, version: int) -> None:
        """Put a new state dict, policy version ``version``, where workers load it from on `ApplyWeights`."""

    @abstractmethod
    def attach_storage(self, w: int, storage: Any) -> None:
        """Let worker ``w`` write batches into ``storage``'s rows (see ``memory``)."""

    # -- control words -----------------------------------------------------------------------
    @abstractmethod
    def preempt(self, w: int, seq: int) -> None:
        """Ask worker ``w`` to cut request ``seq`` short at its next step."""

    @abstractmethod
    def progress(self, w: int) -> tuple[int, bool] | None:
        """Worker ``w``'s progress count and busy flag (``None`` if it is not started)."""

    @abstractmethod
    def pid(self, w: int) -> int | None:
        """The process id that runs worker ``w`` (for messages and `WorkerError`)."""

    @abstractmethod
    def kill(self, w: int) -> None:
        """Stop a hung worker at once; its `Exited` event follows (only if ``can_kill``)."""


class WorkerChannel(ABC):
    """The worker loop's side of a transport: commands in, events out, where to write.

    Called from the worker's own thread of control only.
    """

    #: The worker's control words (an int64 numpy array of `CONTROL_WORDS`), once slots exist.
    control: Any

    @abstractmethod
    def receive(self) -> Command:
        """Block until the next command."""

    @abstractmethod
    def send(self, event: Event) -> None:
        """Send an event to the engine."""

    @abstractmethod
    def output_slots(self, layout: Any, count: int) -> list[dict[Any, Any]]:
        """``count`` output slots shaped by ``layout`` (``[(key, shape, dtype)]``), as tensor dicts.

        Also sets `control`. Returns ``[]`` if the engine closed the worker meanwhile.
        """

    @abstractmethod
    def read_weights(self, into: Callable[[Tensors], None], have: int | None = None) -> int | None:
        """Call ``into`` with the state dict last published with `Transport.publish_weights`.

        Returns the version ``into`` got, or ``None`` where the store cannot tell (the caller
        takes the version its command names). ``have``: the version the caller holds; a store
        that can tell it still holds that one may skip ``into``.
        """

    @abstractmethod
    def storage(self, handle: Any) -> dict[Any, Any]:
        """The columns of a replay buffer's storage named by an `AttachStorage` handle."""

    # The two hooks below are optional: deliberately no-ops by default (not abstract, as only
    # some channels need them), overridden by the channels that do.
    def setup(self, spec: Any) -> None:  # noqa: B027
        """Prepare the worker's process for its `WorkerSpec` (torch threads, ...); nothing by default."""

    def attach_runner(self, activity: Callable[[], int], interrupt: Callable[[], None]) -> None:  # noqa: B027
        """Watch a runner that works between commands on its own (a collection node's collector).

        A transport that hosts such runners counts ``activity()`` (it grows with every env
        step) in the worker's progress, so liveness sees a long batch advance, and calls
        ``interrupt()`` (from any thread) when the engine says stop, so the batch in progress
        ends at once. Nothing by default.
        """

    def batch_ready(self, slot: int) -> None:
        """Say that ``slot`` holds a finished batch (a remote transport also ships it here)."""
        from ._messages import BatchReady

        self.send(BatchReady(slot))

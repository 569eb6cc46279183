"""The trainer side of request/response transports (torch RPC, Ray): `RemoteTransport`.

Each node is a `NodeHost` (``_remote_node``) on the remote side, reached only through
remote calls whose completion runs a callback in the engine's own thread. The event loop
never waits on a call: it sends a command as a call and forgets it, and one long poll per
node (`NodeHost.poll`) brings back the node's events, its finished batches and its
progress. When a poll completes its callback queues what came back, wakes the loop through
a `Notifier` and issues the next poll. Nothing polls on the trainer: a call completes,
fails (the node died: `Exited`), or stays pending (the node stopped answering: liveness).

An engine module subclasses `RemoteTransport` and provides the remote half: bring the engine
up (`_open`), host a node (`_create`), make a call (`_call`), end a node (`_destroy`), and
close (`_close_engine`). See ``_rpc.py`` and ``_ray.py``.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import anyio.to_thread
import torch

from .._core._errors import WorkerCrashedError, worker_error_from_message
from .._core._notify import Notifier
from ._messages import ApplyWeights, BatchReady, Close, Command, Event, Exited, Failed, Ready
from ._node_events import receive_events, take_events
from ._remote_node import HostSetup, PollResult
from ._transport import Tensors, Transport
from ._wire import NodePid

__all__ = ["RemoteTransport"]

#: A remote call's completion: ``done(result, None)`` or ``done(None, error)``.
Done = Callable[[Any, BaseException | None], None]


class _Remote:
    """The trainer's view of one node (``rank = w + 1``)."""

    def __init__(self) -> None:
        self.handle: Any = None  # the engine's reference to the node's host (None: not running)
        self.info: tuple[int, str, str] | None = None  # pid, hostname, address
        self.gen = 0  # bumped at every start and stop: late callbacks of an old host are ignored
        self.seq = 0
        self.events: deque[Event] = deque()
        self.batches: dict[int, dict[Any, Any]] = {}
        self.progress: tuple[int, bool] | None = None
        self.gone = False  # its loop ended, or a call to it failed
        self.error: BaseException | None = None  # why a call failed


class RemoteTransport(Transport):
    """Nodes reached through remote calls; subclasses provide the engine (RPC, Ray)."""

    memory = "none"
    can_kill = True
    #: The engine kills a host's process once its loop has ended (no exit handlers run there).
    kills_hosts = False

    def __init__(self, num_workers: int, options: dict[str, Any], weights_layout: Any) -> None:
        super().__init__(num_workers, options, weights_layout)
        self._nodes = [_Remote() for _ in range(num_workers)]
        self._notifier = Notifier()
        self._weights: dict[Any, Any] | None = None  # the last published state (CPU tensors)
        self._open_lock = threading.Lock()
        self._opened = False
        self._open_error: BaseException | None = None
        self._closed = False

    # -- the engine's half -------------------------------------------------------------------
    @abstractmethod
    def _open(self) -> None:
        """Bring the engine up (start or join it, launch node processes); blocking, once."""

    @abstractmethod
    def _create(self, w: int, setup: HostSetup) -> tuple[Any, tuple[int, str, str]]:
        """Host node ``w`` (blocking): return its handle and `NodeHost.info`."""

    @abstractmethod
    def _call(self, handle: Any, method: str, args: tuple[Any, ...], done: Done) -> None:
        """Call ``NodeHost.<method>(*args)`` on ``handle`` without waiting; ``done`` runs on completion."""

    @abstractmethod
    def _destroy(self, w: int, handle: Any, timeout: float) -> None:
        """End node ``w``'s host (blocking): let it finish within ``timeout``, then force it."""

    @abstractmethod
    def _close_engine(self) -> None:
        """Close what `_open` started (blocking); the nodes are already gone."""

    def _weights_payload(self) -> Any:
        """What an `ApplyWeights` push carries (the state itself; Ray sends a reference)."""
        return self._weights

    def _exitcode(self, w: int) -> int | None:
        """The exit code of node ``w``'s process, when the engine knows it."""
        return None

    async def _start_failure(self, w: int, exc: Exception) -> BaseException:
        """The error to raise when hosting node ``w`` failed with ``exc`` (default: its process died)."""
        return WorkerCrashedError(w, None, await anyio.to_thread.run_sync(self._exitcode, w), during_startup=True)

    def _kill(self, w: int, handle: Any) -> None:
        """Stop a hung node now (its pending calls then fail)."""
        self._destroy(w, handle, 0.0)

    # -- life --------------------------------------------------------------------------------
    def _ensure_open(self) -> None:
        with self._open_lock:
            if self._closed:
                raise RuntimeError("the transport is closed")
            if self._open_error is not None:
                raise self._open_error  # every node's start fails the same way
            if not self._opened:
                self._opened = True  # set first: a failed start still closes what it began
                try:
                    self._open()
                except BaseException as exc:
                    self._open_error = exc
                    raise

    async def start(self, w: int, spec: bytes) -> Any:
        opts = self.options
        deadline = anyio.current_time() + opts["join_timeout"]
        node = self._nodes[w]
        failure: Exception | None = None
        with anyio.fail_after(opts["join_timeout"]):
            await anyio.to_thread.run_sync(self._ensure_open)
            setup = HostSetup(
                opts["worker_main"], spec, self._weights, opts["beat_interval"], killed_after=self.kills_hosts
            )
            try:
                handle, info = await anyio.to_thread.run_sync(self._create, w, setup)
            except Exception as exc:
                failure = exc
        if failure is not None:  # out of the deadline's scope: explaining it may take a moment
            raise await self._start_failure(w, failure) from failure
        node.handle, node.info, node.gone, node.error = handle, info, False, None
        node.gen += 1
        node.seq, node.events, node.batches, node.progress = 0, deque(), {}, (0, False)
        self._poll(w, node.gen)
        with anyio.CancelScope(deadline=deadline):  # move_on_at is newer than anyio 4.7
            while True:
                await self._notifier.wait_until(lambda: bool(node.events), key=w)
                with self._notifier.lock:
                    event = node.events.popleft()
                if isinstance(event, Ready):
                    return event.layout
                if isinstance(event, Failed):
                    raise worker_error_from_message(w, self.pid(w), event)
                if isinstance(event, Exited):
                    raise WorkerCrashedError(w, self.pid(w), event.exitcode, during_startup=True) from node.error
                raise RuntimeError(f"node {w} sent {event!r} during start-up")  # pragma: no cover - a protocol bug
        raise TimeoutError(
            f"node {w} (pid {self.pid(w)}) started but was not ready within join_timeout={opts['join_timeout']}s: in "
            "that time a node builds its collector and collects its first batch (its layout); raise join_timeout "
            "for slow envs or large batches"
        )

    def _poll(self, w: int, gen: int) -> None:
        node = self._nodes[w]
        try:
            self._call(node.handle, "poll", (), partial(self._polled, w, gen))
        except Exception as exc:  # the engine refused the call: the node is unreachable
            self._polled(w, gen, None, exc)

    def _polled(self, w: int, gen: int, result: PollResult | None, error: BaseException | None) -> None:
        """A poll completed (any thread): queue what it brought and poll again."""
        node = self._nodes[w]
        if gen != node.gen:
            return  # a host that was stopped meanwhile
        if error is not None or result is None:
            node.gone, node.error = True, error
            self._push(w, [Exited(None)])
            return
        node.progress = (result.progress, result.busy)
        events = []
        for event, tensors in result.events:
            if isinstance(event, BatchReady) and tensors is not None:
                node.batches[event.slot] = tensors
            events.append(event)
        if result.finished:
            node.gone = True
            events.append(Exited(0))
        self._push(w, events)
        if not result.finished and not self._closed:
            self._poll(w, gen)

    def _push(self, w: int, events: list[Event]) -> None:
        with self._notifier.lock:
            self._nodes[w].events.extend(events)
        self._notifier.notify(w)

    async def stop(self, w: int, timeout: float) -> None:
        node = self._nodes[w]
        if node.handle is None:
            return
        self.send(w, Close())
        with anyio.move_on_after(timeout):
            await self._notifier.wait_until(lambda: node.gone, key=w)
        pid = self.pid(w)
        handle, node.handle = node.handle, None
        node.gen += 1
        await anyio.to_thread.run_sync(self._destroy, w, handle, 0.0 if node.gone else 1.0)
        node.batches, node.progress = {}, None
        with self._notifier.lock:
            self._keep_close_failure(w, pid, list(node.events))
            node.events = deque()
        self._notifier.notify(w)  # not notify_all: the other nodes' stops still wait on theirs

    async def aclose(self, timeout: float) -> None:
        self.stop_nowait()
        with anyio.move_on_after(timeout * 3):
            async with anyio.create_task_group() as tg:
                for w in range(self.num_workers):
                    tg.start_soon(self.stop, w, timeout)
        # Off the loop: closing an engine (rpc.shutdown, ray.shutdown) takes a second or more.
        await anyio.to_thread.run_sync(self.close_now)

    def stop_nowait(self) -> None:
        for node in self._nodes:
            if node.handle is not None and not node.gone:
                self._call_quietly(node.handle, "stop", ())

    def close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w, node in enumerate(self._nodes):
            handle, node.handle = node.handle, None
            node.gen += 1
            if handle is not None:
                try:
                    self._destroy(w, handle, 0.0)
                except Exception:  # best effort: the engine closes below anyway
                    pass
        with self._open_lock:
            if self._opened:
                self._close_engine()
        self._notifier.notify_all()

    def _call_quietly(self, handle: Any, method: str, args: tuple[Any, ...]) -> None:
        # A failed command means a dead node: its poll fails too and reports the exit.
        try:
            self._call(handle, method, args, _ignore)
        except Exception:  # see above
            pass

    # -- commands and events -----------------------------------------------------------------
    def send(self, w: int, command: Command) -> None:
        node = self._nodes[w]
        if node.handle is None or node.gone:
            return
        weights = self._weights_payload() if isinstance(command, ApplyWeights) else None
        seq, node.seq = node.seq, node.seq + 1
        self._call_quietly(node.handle, "push", (seq, command, weights))

    def receive_nowait(self, workers: list[int]) -> list[tuple[int, Event]]:
        return take_events(self._notifier, self._queue, workers, _unknown)

    async def receive(self, workers: list[int]) -> list[tuple[int, Event]]:
        return await receive_events(self._notifier, self._queue, workers, _unknown, self._learn_code)

    def _queue(self, w: int) -> deque[Event]:
        return self._nodes[w].events

    async def _learn_code(self, w: int) -> int | None:
        return await anyio.to_thread.run_sync(self._exitcode, w)

    # -- data --------------------------------------------------------------------------------
    def batch(self, w: int, slot: int) -> Tensors:
        return self._nodes[w].batches[slot]

    def publish_weights(self, state: Tensors, version: int) -> None:
        # A fresh copy per version: a push still being serialized keeps the one it was given.
        with torch.no_grad():
            self._weights = {k: torch.as_tensor(v).detach().to("cpu", copy=True) for k, v in state.items()}

    def attach_storage(self, w: int, storage: Any) -> None:
        raise RuntimeError("remote nodes cannot write into the trainer's replay buffer")  # memory = "none"

    # -- control words -----------------------------------------------------------------------
    def preempt(self, w: int, seq: int) -> None:
        pass  # nodes are never asked to cut a batch short (no preemptive_threshold)

    def progress(self, w: int) -> tuple[int, bool] | None:
        return self._nodes[w].progress

    def pid(self, w: int) -> int | None:
        info = self._nodes[w].info
        return None if info is None else NodePid(info[0], f"{info[1]} ({info[2]})", w + 1)

    def kill(self, w: int) -> None:
        node = self._nodes[w]
        if node.handle is not None:
            self._kill(w, node.handle)


def _unknown(w: int) -> tuple[bool, int | None]:
    return False, None  # only `_exitcode` can tell, and it may block


def _ignore(result: Any, error: BaseException | None) -> None:
    pass

"""The node side of the distributed transport: process entry point and `NodeChannel`.

A node connects to the trainer's TCPStore (torchrun-style ``MASTER_ADDR``/``MASTER_PORT``
and ``RANK``), learns the trainer's control address from it, connects, says `Hello`, and is
told (`Setup`) which pair group to join and what to run: the worker loop of ``_loop`` for a
remote worker, or a whole collector (``aiocollect._dist._node``) for a collection node. It
imports neither anyio nor the engine.
"""

from __future__ import annotations

import importlib
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np

from ._launch_group import may_start_processes
from ._messages import ApplyWeights, Close, Command, Event
from ._transport import BUSY, CONTROL_WORDS, PREEMPT, PROGRESS, STOP, Tensors, WorkerChannel
from ._wire import (
    DATA_TAG,
    WEIGHTS_TAG,
    Beat,
    Hello,
    Preempt,
    Reject,
    Setup,
    Stop,
    WeightsLayout,
    data_device,
    flat_buffer,
    flat_views,
    pair_group,
    recv_frame,
    send_frame,
)

__all__ = ["NodeChannel", "node_main"]

CONTROL_KEY = "aiocollect/control"


def control_key() -> str:
    """The store key of the trainer's control address.

    Under torchrun the store is its agent's and outlives a restart of the job: the key names
    the attempt (``TORCHELASTIC_RESTART_COUNT``), so no node reads a dead trainer's address.
    """
    return f"{CONTROL_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def torchrun_store_port() -> int | None:
    """``MASTER_PORT`` where a torchrun agent already serves the store there, else None."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and os.environ.get("MASTER_PORT"):
        return int(os.environ["MASTER_PORT"])
    return None


class NodeChannel(WorkerChannel):
    """Commands and control words over the node's TCP connection, tensors over its pair group."""

    def __init__(self, sock: socket.socket, pg: Any, setup: Setup) -> None:
        self._sock, self._pg, self._setup = sock, pg, setup
        self._send_lock = threading.Lock()
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._device = data_device(setup.backend)
        self.control = np.zeros(CONTROL_WORDS, dtype=np.int64)
        self._flats: list[Any] = []
        self._weights_flat: Any = None
        self._weights: dict[Any, Any] = {}
        self._weights_due = 0  # weight transfers announced and not yet received
        if setup.weights_layout is not None:
            self._weights_flat = flat_buffer(setup.weights_layout, self._device)
            self._weights = flat_views(self._weights_flat, setup.weights_layout)
            self._weights_due = int(setup.weights_follow)
        self._activity: Callable[[], int] | None = None
        self._interrupt: Callable[[], None] | None = None
        self._done = threading.Event()
        self._threads = [
            threading.Thread(target=self._read, name="aiocollect-node-reader", daemon=True),
            threading.Thread(target=self._beat, name="aiocollect-node-beat", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self) -> None:
        """Commands to the queue; control words set at once, even in the middle of a batch."""
        try:
            while True:
                msg = recv_frame(self._sock)
                if isinstance(msg, Preempt):
                    self.control[PREEMPT] = msg.seq
                elif isinstance(msg, Stop):
                    self._stop()
                elif isinstance(msg, WeightsLayout):
                    # Before the `ApplyWeights` it precedes is queued: its weights land here.
                    self._weights_flat = flat_buffer(msg.layout, self._device)
                    self._weights = flat_views(self._weights_flat, msg.layout)
                else:
                    self._commands.put(msg)
        except (EOFError, OSError):
            # The trainer is gone (or closed us): stop whatever runs and leave.
            self._stop()
            self._commands.put(Close())

    def _stop(self) -> None:
        self.control[STOP] = 1  # first: a runner that starts a batch after this sees it
        interrupt = self._interrupt
        if interrupt is not None:
            interrupt()

    def _progress(self) -> int:
        count = int(self.control[PROGRESS])
        activity = self._activity
        if activity is not None:
            try:
                count += activity()
            except Exception:
                pass
        return count

    def _beat(self) -> None:
        last = None
        interval = self._setup.beat_interval
        while not self._done.wait(interval):
            now = (self._progress(), bool(self.control[BUSY]))
            if now != last:
                try:
                    send_frame(self._sock, Beat(*now), self._send_lock)
                except OSError:
                    return
                last = now

    def close(self) -> None:
        """End the connection and this channel's threads, then drop the pair group.

        The group goes while the interpreter still runs: a gloo group left to interpreter exit
        aborts the process ("terminate called without an active exception").
        """
        self._done.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # the reader sees end of file and ends
        except OSError:
            pass
        for t in self._threads:
            t.join(5.0)
        self._pg = None

    # -- WorkerChannel -----------------------------------------------------------------------
    def receive(self) -> Command:
        cmd = self._commands.get()
        if isinstance(cmd, ApplyWeights):
            self._weights_due += 1
        return cmd

    def send(self, event: Event) -> None:
        send_frame(self._sock, event, self._send_lock)

    def output_slots(self, layout: Any, count: int) -> list[dict[Any, Any]]:
        self._flats = [flat_buffer(layout, self._device) for _ in range(count)]
        return [flat_views(f, layout) for f in self._flats]

    def read_weights(self, into: Callable[[Tensors], None], have: int | None = None) -> int | None:
        # Every announced update is received in order, so the newest one wins and the
        # trainer's sends never wait on a node that skipped one.
        while self._weights_due > 0:
            self._pg.recv([self._weights_flat], 0, WEIGHTS_TAG).wait()
            self._weights_due -= 1
        into(self._weights)
        return None

    def storage(self, handle: Any) -> dict[Any, Any]:
        raise RuntimeError("distributed workers cannot write into the trainer's replay buffer")

    def setup(self, spec: Any) -> None:
        import torch

        threads = getattr(spec, "num_sub_threads", None)
        if threads:
            torch.set_num_threads(threads)

    def attach_runner(self, activity: Callable[[], int], interrupt: Callable[[], None]) -> None:
        self._activity, self._interrupt = activity, interrupt
        if self.control[STOP]:
            interrupt()

    def batch_ready(self, slot: int) -> None:
        from ._messages import BatchReady

        with self._send_lock:  # the frame and its tensor leave together, in this order
            send_frame(self._sock, BatchReady(slot), _NOLOCK)
            self._pg.send([self._flats[slot]], 0, DATA_TAG).wait()


class _NoLock:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


_NOLOCK: Any = _NoLock()


def _connect(
    master_addr: str, store_port: int, bind_host: str | None, timeout: float
) -> tuple[Any, socket.socket, str]:
    import torch.distributed as dist

    store = dist.TCPStore(master_addr, store_port, is_master=False, timeout=timedelta(seconds=timeout))
    host, port, token = store.get(control_key()).decode().rsplit(":", 2)
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            if bind_host:
                sock.bind((bind_host, 0))
            sock.connect((host, int(port)))
            break
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # the listener is up before the key is set: only a full backlog gets here
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return store, sock, token


def _pick_cuda_device(rank: int, chosen: int | None) -> None:
    """Make this node's GPU the current device before its NCCL pair group forms.

    NCCL refuses two members of a group on one GPU, so a node on the trainer's machine
    (``launcher="mp"``) takes the GPU the trainer chose for it (``chosen``: one that is not
    the trainer's). Elsewhere ``LOCAL_RANK`` (torchrun's) wins where it is set, else GPU
    ``rank % count``.
    """
    import torch

    local = os.environ.get("LOCAL_RANK")
    if chosen is not None:
        torch.cuda.set_device(chosen)
    else:
        torch.cuda.set_device(int(local) if local is not None else rank % torch.cuda.device_count())


def node_main(
    master_addr: str,
    store_port: int,
    rank: int,
    bind_host: str | None = None,
    timeout: float = 300.0,
    world_size: int | None = None,
) -> None:
    """Join the collector whose TCPStore is at ``master_addr:store_port`` as node ``rank`` (>= 1).

    Returns when the trainer closes the node (or goes away). Errors of the worker are sent to
    the trainer; only failures to connect are raised here, and a trainer that turns the node
    away (a rank out of range or already taken, a wrong ``world_size``) ends it with
    ``SystemExit`` and the trainer's reason.
    """
    # A launcher starts nodes as daemon processes (so an exiting trainer never waits for
    # them), but a node's own collector starts worker processes: allow it to.
    may_start_processes()
    store, sock, token = _connect(master_addr, store_port, bind_host, timeout)
    lock = threading.Lock()
    host = sock.getsockname()[0]
    try:
        send_frame(sock, Hello(rank, token, os.getpid(), host, socket.gethostname(), world_size), lock)
        setup = recv_frame(sock)
        if isinstance(setup, Reject):
            raise SystemExit(
                f"aiocollect node: the trainer at {master_addr}:{store_port} turned RANK={rank} away: {setup.reason}"
            )
        if setup.backend == "nccl":
            _pick_cuda_device(rank, setup.cuda_device)
        channel = NodeChannel(sock, pair_group(store, setup.prefix, 1, setup.backend, host, setup.timeout), setup)
        module, _, name = setup.worker_main.partition(":")
        try:
            getattr(importlib.import_module(module), name)(channel, setup.spec)
        finally:
            channel.close()
            del channel
    except (EOFError, ConnectionError):
        return  # the trainer went away: nothing is waiting for this node any more
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def main_from_env() -> None:
    """Run a node from torchrun-style variables: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``.

    ``WORLD_SIZE`` (optional) is checked by the trainer: the number of nodes plus one.
    ``AIOCOLLECT_NODE_ADDR`` optionally names the local address to connect from.
    """
    example = "e.g. MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 RANK=1 python -m aiocollect.node"
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK") if not os.environ.get(k)]
    if missing:
        raise SystemExit(
            f"aiocollect node: set {', '.join(missing)} (the trainer's address, its tcp_port and this node's "
            f"rank, 1 or more), {example}"
        )
    ints = {}
    for key in ("MASTER_PORT", "RANK", "WORLD_SIZE"):
        value = os.environ.get(key)
        if value is None:
            continue
        try:
            ints[key] = int(value)
        except ValueError:
            raise SystemExit(f"aiocollect node: {key} must be an integer, got {value!r}; {example}") from None
    if ints["RANK"] < 1:
        raise SystemExit(f"aiocollect node: RANK must be 1 or more (rank 0 is the trainer), got {ints['RANK']}")
    node_main(
        os.environ["MASTER_ADDR"],
        ints["MASTER_PORT"],
        ints["RANK"],
        os.environ.get("AIOCOLLECT_NODE_ADDR"),
        world_size=ints.get("WORLD_SIZE"),
    )

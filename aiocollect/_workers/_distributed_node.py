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
from datetime import timedelta
from typing import Any

import numpy as np

from ._messages import ApplyWeights, Close, Command, Event
from ._transport import BUSY, CONTROL_WORDS, PROGRESS, PREEMPT, STOP, WorkerChannel
from ._wire import (
    DATA_TAG,
    WEIGHTS_TAG,
    Beat,
    Hello,
    Preempt,
    Setup,
    Stop,
    data_device,
    flat_buffer,
    flat_views,
    pair_group,
    recv_frame,
    send_frame,
)

__all__ = ["NodeChannel", "node_main"]

CONTROL_KEY = "aiocollect/control"


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
        self._done = threading.Event()
        threading.Thread(target=self._read, name="aiocollect-node-reader", daemon=True).start()
        threading.Thread(target=self._beat, name="aiocollect-node-beat", daemon=True).start()

    def _read(self) -> None:
        """Commands to the queue; control words set at once, even in the middle of a batch."""
        try:
            while True:
                msg = recv_frame(self._sock)
                if isinstance(msg, Preempt):
                    self.control[PREEMPT] = msg.seq
                elif isinstance(msg, Stop):
                    self.control[STOP] = 1
                else:
                    self._commands.put(msg)
        except (EOFError, OSError):
            # The trainer is gone (or closed us): stop whatever runs and leave.
            self.control[STOP] = 1
            self._commands.put(Close())

    def _beat(self) -> None:
        last = None
        interval = self._setup.beat_interval
        while not self._done.wait(interval):
            now = (int(self.control[PROGRESS]), bool(self.control[BUSY]))
            if now != last:
                try:
                    send_frame(self._sock, Beat(*now), self._send_lock)
                except OSError:
                    return
                last = now

    def close(self) -> None:
        """Stop the heartbeat (the connection itself is closed by `node_main`)."""
        self._done.set()

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

    def weights(self) -> Any:
        # Every announced update is received in order, so the newest one wins and the
        # trainer's sends never wait on a node that skipped one.
        while self._weights_due > 0:
            self._pg.recv([self._weights_flat], 0, WEIGHTS_TAG).wait()
            self._weights_due -= 1
        return self._weights

    def storage(self, handle: Any) -> dict[Any, Any]:
        raise RuntimeError("distributed workers cannot write into the trainer's replay buffer")

    def setup(self, spec: Any) -> None:
        import torch

        threads = getattr(spec, "num_sub_threads", None)
        if threads:
            torch.set_num_threads(threads)

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


def _connect(master_addr: str, store_port: int, bind_host: str | None, timeout: float) -> tuple[Any, socket.socket, str]:
    import torch.distributed as dist

    store = dist.TCPStore(master_addr, store_port, is_master=False, timeout=timedelta(seconds=timeout))
    host, port, token = store.get(CONTROL_KEY).decode().rsplit(":", 2)
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


def node_main(master_addr: str, store_port: int, rank: int, bind_host: str | None = None, timeout: float = 300.0) -> None:
    """Join the collector whose TCPStore is at ``master_addr:store_port`` as node ``rank`` (>= 1).

    Returns when the trainer closes the node (or goes away). Errors of the worker are sent to
    the trainer; only failures to connect are raised here.
    """
    import multiprocessing

    # A launcher starts nodes as daemon processes (so an exiting trainer never waits for
    # them), but a node's own collector starts worker processes: allow it to.
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    store, sock, token = _connect(master_addr, store_port, bind_host, timeout)
    lock = threading.Lock()
    host = sock.getsockname()[0]
    try:
        send_frame(sock, Hello(rank, token, os.getpid(), host, socket.gethostname()), lock)
        setup: Setup = recv_frame(sock)
        pg = pair_group(store, setup.prefix, 1, setup.backend, host, setup.timeout)
        channel = NodeChannel(sock, pg, setup)
        module, _, name = setup.worker_main.partition(":")
        try:
            getattr(importlib.import_module(module), name)(channel, setup.spec)
        finally:
            channel.close()
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

    ``AIOCOLLECT_NODE_ADDR`` optionally names the local address to connect from.
    """
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK") if k not in os.environ]
    if missing:
        raise SystemExit(
            f"aiocollect node: set {', '.join(missing)} (the trainer's address, its tcp_port and this node's "
            "rank, 1 or more), e.g. MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 RANK=1 python -m aiocollect.node"
        )
    rank = int(os.environ["RANK"])
    if rank < 1:
        raise SystemExit(f"aiocollect node: RANK must be 1 or more (rank 0 is the trainer), got {rank}")
    node_main(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, os.environ.get("AIOCOLLECT_NODE_ADDR"))

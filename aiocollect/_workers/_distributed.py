"""The torch.distributed transport: workers are processes on other machines (or this one).

The trainer hosts a ``TCPStore`` (torchrun's ``MASTER_PORT``; free by default) and a control
listener whose address it publishes in the store. A node connects, says which rank it is,
and is told which private pair group (``_wire.pair_group``) to join and what to run. From
then on records travel over the node's TCP connection and tensors over its pair group:

* the event loop never blocks: one reader thread per node receives its records (and, right
  after a `BatchReady`, the batch itself into the node's receive slots), queues them and
  wakes the loop through a `Notifier`. Nothing polls: the thread sleeps in ``recv``.
* a node that dies closes its connection: the reader sees end of file at once and reports
  `Exited`, never a hang in a collective.
* liveness: the node reports its progress count when it changes (`Beat`), so a node that
  stops answering goes silent and the engine's liveness rule applies to it as to any worker.

``launcher`` says who starts nodes: ``"mp"`` (local processes), ``"submitit"`` (SLURM jobs,
or submitit's local executor) or ``"external"`` (``python -m aiocollect.node`` started by you).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import threading
from collections import deque
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import anyio
import anyio.to_thread
import torch

from .._core._errors import WorkerCrashedError, worker_error_from_message
from .._core._notify import Notifier
from ._distributed_close import close_nodes
from ._distributed_node import control_key, node_main, torchrun_store_port
from ._distributed_options import check_options, local_node_gpu
from ._launch_ray import check_ray_node_count
from ._launchers import make_launcher
from ._messages import ApplyWeights, BatchReady, Close, Command, Event, Exited, Failed, Ready
from ._node_events import receive_events, take_events
from ._prestart import node_preload
from ._transport import Tensors, Transport
from ._wire import (
    DATA_TAG,
    WEIGHTS_TAG,
    Beat,
    Hello,
    NodePid,
    Preempt,
    Reject,
    Setup,
    Stop,
    WeightsLayout,
    data_device,
    flat_buffer,
    flat_views,
    gloo_device,
    pair_group,
    recv_frame,
    send_frame,
)

__all__ = ["DistributedTransport", "transport_class"]


class _Node:
    """The trainer's view of one node (``rank = w + 1``)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.hello: Hello | None = None
        self.pg: Any = None
        self.reader: threading.Thread | None = None
        self.events: deque[Event] = deque()
        self.progress: tuple[int, bool] | None = None
        self.slots: list[dict[Any, Any]] = []
        self.flats: list[Any] = []
        self.sends: list[Any] = []  # weight sends not known to be complete (they hold their tensors)
        self.has_layout = False  # the node can receive weights (it was told their layout)
        self.joins = 0
        self.gone = False  # the reader saw the connection end
        self.lock = threading.Lock()  # serializes records sent from the loop


class DistributedTransport(Transport):
    """Workers are torch.distributed peers: a pair group each, records over TCP."""

    memory = "none"
    can_kill = True

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return check_options(options)

    def __init__(self, num_workers: int, options: dict[str, Any], weights_layout: Any) -> None:
        super().__init__(num_workers, options, weights_layout)
        import torch.distributed as dist

        hosts = options["node_hosts"]
        if hosts is not None and len(hosts) != num_workers:
            raise ValueError(f"node_hosts lists {len(hosts)} addresses for {num_workers} nodes; give one per node")
        check_ray_node_count(options, num_workers)
        self._nodes = [_Node() for _ in range(num_workers)]
        self._notifier = Notifier()
        self._token = secrets.token_hex(16)
        self._session = secrets.token_hex(4)  # pair-group keys of this collector only, in a shared store
        self._device = data_device(options["backend"])
        self._weights: Any = None  # the flat buffer of the last published weights
        # One gloo device for every node's pair group (see `gloo_device`): dropping a group
        # is then quick, and the device goes once, at close.
        self._gloo: Any = None
        self._gloo_lock = threading.Lock()
        addr = options["master_addr"]
        # Under torchrun the agent already serves a store on MASTER_PORT: use it, as
        # init_process_group would, instead of failing to listen there.
        agent = options["launcher"] == "external" and options["tcp_port"] == torchrun_store_port()
        try:
            store = dist.TCPStore(
                addr, options["tcp_port"] or 0, is_master=not agent, wait_for_workers=False,
                timeout=timedelta(seconds=options["join_timeout"]),
            )  # fmt: skip
        except Exception as exc:
            raise OSError(
                f"cannot listen on {addr}:{options['tcp_port'] or 0} for nodes ({exc}); pass a free tcp_port"
            ) from exc
        self._store: dist.TCPStore | None = store  # None once closed
        self._port = int(store.port)
        family = (
            socket.AF_INET6
            if ipaddress.ip_address(socket.gethostbyname(addr) if ":" not in addr else addr).version == 6
            else socket.AF_INET
        )
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.bind((addr, 0))
        self._listener.listen(max(16, num_workers))
        self._joined: dict[int, tuple[socket.socket, Hello]] = {}
        self._closed = False
        threading.Thread(target=self._accept, name="aiocollect-accept", daemon=True).start()
        store.set(control_key(), f"{addr}:{self._listener.getsockname()[1]}:{self._token}")
        self._launcher = make_launcher(
            options, preload=node_preload(("torch.distributed", node_main.__module__), options["worker_main"])
        )

    @property
    def store_port(self) -> int:
        """The TCPStore's port (``MASTER_PORT`` for nodes)."""
        return int(self._port)

    # -- joining -----------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed: the transport is shutting down
            try:
                sock.settimeout(10.0)  # a hello is one small frame; a silent stray connection is dropped
                hello = recv_frame(sock)
                sock.settimeout(None)
                ok = isinstance(hello, Hello) and secrets.compare_digest(hello.token, self._token)
            except Exception:
                ok = False
            if not ok:
                sock.close()
                continue
            reason = self._refusal(hello)
            if reason is not None:
                self._turn_away(sock, reason)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._notifier.lock:
                old = self._joined.pop(hello.rank, None)
                self._joined[hello.rank] = (sock, hello)
            if old is not None:
                # Two nodes joined as one rank before it started: the newest wins (a restarted
                # node replaces a stale one), and the other is told why it has to go.
                self._turn_away(old[0], f"RANK={hello.rank} was taken by a newer node, {self._who(hello)}")
            self._notifier.notify(hello.rank - 1)  # wakes that node's start, not every node's

    def _refusal(self, hello: Hello) -> str | None:
        """Why a node with a valid token cannot join (a misconfigured external node), or None."""
        n = self.num_workers
        if not 1 <= hello.rank <= n:
            return (
                f"RANK={hello.rank} is out of range: this collector has {n} nodes, ranks 1 to {n} (rank 0 is the "
                "trainer)"
            )
        if hello.world_size is not None and hello.world_size != n + 1:
            return (
                f"WORLD_SIZE={hello.world_size} does not match this collector: {n} nodes and the trainer make {n + 1}"
            )
        node = self._nodes[hello.rank - 1]
        if node.sock is not None and not node.gone and node.hello is not None:
            return f"RANK={hello.rank} is already running as {self._who(node.hello)}; give each node its own RANK"
        return None

    @staticmethod
    def _who(hello: Hello) -> str:
        return f"pid {hello.pid} on {hello.hostname} ({hello.host})"

    @staticmethod
    def _turn_away(sock: socket.socket, reason: str) -> None:
        try:
            send_frame(sock, Reject(reason), threading.Lock())
        except OSError:
            pass
        sock.close()

    async def _wait_join(self, w: int) -> tuple[socket.socket, Hello]:
        rank, launcher = w + 1, self._launcher
        sentinel = launcher.sentinel(rank)

        async def died() -> None:
            if sentinel is None:
                await anyio.sleep_forever()
            else:
                await anyio.wait_readable(sentinel)

        with anyio.fail_after(self.options["join_timeout"]):
            async with anyio.create_task_group() as tg:
                dead = []

                async def watch() -> None:
                    await died()
                    dead.append(True)
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                await self._notifier.wait_until(lambda: rank in self._joined, key=w)
                tg.cancel_scope.cancel()
        if dead and rank not in self._joined:
            await anyio.to_thread.run_sync(launcher.reap, rank, 1.0)
            raise WorkerCrashedError(w, None, launcher.exitcode(rank), during_startup=True)
        with self._notifier.lock:
            return self._joined.pop(rank)

    # -- life --------------------------------------------------------------------------------
    async def start(self, w: int, spec: bytes) -> Any:
        node, rank, opts = self._nodes[w], w + 1, self.options
        deadline = anyio.current_time() + opts["join_timeout"]
        if opts["launcher"] != "external":
            hosts = opts["node_hosts"]
            args = (
                opts["master_addr"],
                self.store_port,
                rank,
                None if hosts is None else hosts[w],
                opts["join_timeout"],
            )
            await anyio.to_thread.run_sync(self._launcher.launch, rank, args)
        try:
            sock, hello = await self._wait_join(w)
        except TimeoutError:
            raise TimeoutError(
                f"node {w} (rank {rank}) did not join within join_timeout={opts['join_timeout']}s; "
                f"start it with MASTER_ADDR={opts['master_addr']} MASTER_PORT={self.store_port} RANK={rank} "
                "python -m aiocollect.node, or check the launcher's logs"
            ) from None
        node.joins += 1
        node.sock, node.hello, node.events, node.progress, node.gone = sock, hello, deque(), (0, False), False
        setup = Setup(
            prefix=f"{self._session}/r{rank}j{node.joins}", backend=opts["backend"], timeout=opts["join_timeout"],
            worker_main=opts["worker_main"], spec=spec, weights_layout=self.weights_layout,
            weights_follow=self._weights is not None, beat_interval=opts["beat_interval"],
            cuda_device=local_node_gpu(rank) if opts["backend"] == "nccl" and opts["launcher"] == "mp" else None,
        )  # fmt: skip
        send_frame(sock, setup, node.lock)
        node.has_layout = self.weights_layout is not None
        node.reader = threading.Thread(
            target=self._read, args=(w, node, setup), name=f"aiocollect-node-{rank}", daemon=True
        )
        node.reader.start()
        # Joining and getting ready share the deadline: a node that hangs while it builds its
        # collector (or collects the first batch that tells the trainer its layout) never
        # holds the trainer's start-up forever.
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
                    code = await self._exitcode(w)
                    raise WorkerCrashedError(w, self.pid(w), code, during_startup=True)
                raise RuntimeError(f"node {w} sent {event!r} during start-up")  # pragma: no cover - a protocol bug
        raise TimeoutError(
            f"node {w} (pid {self.pid(w)}) joined but was not ready within join_timeout={opts['join_timeout']}s: "
            "in that time a node builds its collector and collects its first batch (its layout); raise "
            "join_timeout for slow envs or large batches"
        )

    def _read(self, w: int, node: _Node, setup: Setup) -> None:
        """The node's reader thread: records in, batches into the receive slots, the loop woken."""
        sock = node.sock
        assert sock is not None and node.hello is not None
        try:
            host = self.options["master_addr"]
            device = self._gloo_device(host) if setup.backend == "gloo" else None
            pg = node.pg = pair_group(self._store, setup.prefix, 0, setup.backend, host, setup.timeout, device)
            if setup.weights_follow and self._weights is not None:
                node.sends.append(pg.send([self._weights], 1, WEIGHTS_TAG))
            while True:
                msg = recv_frame(sock)
                if isinstance(msg, Beat):
                    node.progress = (msg.progress, msg.busy)
                    continue
                if isinstance(msg, Ready):
                    node.flats = [flat_buffer(msg.layout, self._device) for _ in range(2)]
                    node.slots = [flat_views(f, msg.layout) for f in node.flats]
                elif isinstance(msg, BatchReady) and msg.payload is None:
                    # The node sends the batch right after this record: the receive is short.
                    pg.recv([node.flats[msg.slot]], 1, DATA_TAG).wait(timedelta(seconds=setup.timeout))
                self._push(w, node, msg)
        except Exception:  # end of file, a reset connection or a failed receive: the node is gone
            node.gone = True
            self._push(w, node, Exited(None))

    def _gloo_device(self, host: str) -> Any:
        with self._gloo_lock:
            if self._gloo is None:
                self._gloo = gloo_device(host)
            return self._gloo

    def _push(self, w: int, node: _Node, event: Event) -> None:
        with self._notifier.lock:
            node.events.append(event)
        self._notifier.notify(w)

    async def _exitcode(self, w: int) -> int | None:
        await self._reap(w + 1, 5.0)
        return self._launcher.exitcode(w + 1)

    async def _reap(self, rank: int, grace: float) -> None:
        """Give node ``rank``'s process ``grace`` seconds to end, then free it (killed if it has not).

        A process that ends in time is freed on the loop: a thread hop per node would make
        closing many nodes cost the trainer a thread wake-up each.
        """
        left = grace
        sentinel = self._launcher.sentinel(rank)
        if sentinel is not None:
            with anyio.move_on_after(grace) as scope:
                try:
                    await anyio.wait_readable(sentinel)
                except anyio.BusyResourceError:
                    pass  # another task waits on it already: the blocking reap below waits too
            if scope.cancelled_caught:
                left = 0.0
            elif self._launcher.release_ended(rank):
                return
        await anyio.to_thread.run_sync(self._launcher.reap, rank, left)

    def _disconnect(self, node: _Node) -> None:
        sock, node.sock = node.sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread with end of file
            except OSError:
                pass
            sock.close()

    async def stop(self, w: int, timeout: float) -> None:
        await close_nodes(self, [w], timeout)

    def _forget(self, node: _Node) -> None:
        if node.reader is not None and node.reader.is_alive():
            _ABANDONED.append(node)  # a receive still runs: dropping its group now would abort the process
        node.reader = None
        node.pg, node.sends = None, []
        node.slots, node.flats, node.progress = [], [], None
        with self._notifier.lock:
            node.events = deque()
        self._notifier.notify_all()

    def stop_nowait(self) -> None:
        for w in range(self.num_workers):
            self._send_record(w, Stop())

    async def aclose(self, timeout: float) -> None:
        self.stop_nowait()
        with anyio.move_on_after(timeout * 3):
            await close_nodes(self, range(self.num_workers), timeout)  # one task for all nodes, not one each
        self.close_now()

    def close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        for node in self._nodes:
            if node.sock is not None:
                self._send_record_to(node, Close())
        self._launcher.close()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
        except OSError:
            pass
        self._listener.close()
        for node in self._nodes:
            self._disconnect(node)
        for node in self._nodes:
            if node.reader is not None:
                node.reader.join(1.0)
            self._forget(node)
        with self._notifier.lock:
            joined, self._joined = self._joined, {}
        for sock, _ in joined.values():
            sock.close()
        self._store = None  # its server socket closes with it: a closed collector holds no port
        with self._gloo_lock:
            self._gloo = None  # groups of abandoned nodes keep it alive as long as they need it

    # -- commands and events -----------------------------------------------------------------
    def _send_record_to(self, node: _Node, record: Any) -> bool:
        if node.sock is None:
            return False
        try:
            send_frame(node.sock, record, node.lock)
            return True
        except OSError:
            return False  # the node is gone: its reader reports how

    def _send_record(self, w: int, record: Any) -> bool:
        return self._send_record_to(self._nodes[w], record)

    def send(self, w: int, command: Command) -> None:
        node = self._nodes[w]
        # A node that joined before the layout was known (`adopt_weights_layout`) is told first.
        if isinstance(command, ApplyWeights) and not node.has_layout and self.weights_layout is not None:
            if not self._send_record_to(node, WeightsLayout(self.weights_layout)):
                return
            node.has_layout = True
        if not self._send_record_to(node, command) or not isinstance(command, ApplyWeights):
            return
        if self._weights is not None and node.pg is not None:
            node.sends = [s for s in node.sends if not s.is_completed()]
            node.sends.append(node.pg.send([self._weights], 1, WEIGHTS_TAG))

    def receive_nowait(self, workers: list[int]) -> list[tuple[int, Event]]:
        return take_events(self._notifier, self._queue, workers, self._code_now)

    async def receive(self, workers: list[int]) -> list[tuple[int, Event]]:
        return await receive_events(self._notifier, self._queue, workers, self._code_now, self._exitcode)

    def _queue(self, w: int) -> deque[Event]:
        return self._nodes[w].events

    def _code_now(self, w: int) -> tuple[bool, int | None]:
        # A node process of ours that has not been reaped yet: `_exitcode` waits for it.
        code = self._launcher.exitcode(w + 1)
        return code is not None or self._launcher.sentinel(w + 1) is None, code

    # -- data --------------------------------------------------------------------------------
    def batch(self, w: int, slot: int) -> Tensors:
        return self._nodes[w].slots[slot]

    def publish_weights(self, state: Tensors, version: int) -> None:
        layout = self.weights_layout
        flat = flat_buffer(layout, self._device)  # a fresh buffer: sends of older versions keep theirs
        views = flat_views(flat, layout)
        with torch.no_grad():
            for k, view in views.items():
                view.copy_(state[k])
        self._weights = flat

    def attach_storage(self, w: int, storage: Any) -> None:
        raise RuntimeError("distributed workers cannot write into the trainer's replay buffer")  # memory = "none"

    # -- control words -----------------------------------------------------------------------
    def preempt(self, w: int, seq: int) -> None:
        self._send_record(w, Preempt(seq))

    def progress(self, w: int) -> tuple[int, bool] | None:
        return self._nodes[w].progress

    def pid(self, w: int) -> int | None:
        hello = self._nodes[w].hello
        return None if hello is None else NodePid(hello.pid, f"{hello.hostname} ({hello.host})", w + 1)

    def kill(self, w: int) -> None:
        if self._launcher.can_kill:
            self._launcher.kill(w + 1)
        else:
            self._disconnect(self._nodes[w])  # the node sees end of file and leaves after its env step


# Nodes whose reader thread could not be joined (a node hung in the middle of sending a
# batch, on a launcher that cannot kill it): kept referenced for the life of the process.
_ABANDONED: list[_Node] = []

transport_class = DistributedTransport

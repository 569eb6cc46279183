"""Plumbing of the distributed transport: framed messages, tensor blocks and pair groups.

Each collection node talks to the trainer over two channels:

* a TCP connection carrying the small records of ``_messages`` (pickled, length-prefixed
  frames). Its end of file is how either side learns that the other is gone, at once.
* a private two-member torch.distributed process group (trainer rank 0, node rank 1)
  carrying tensors: one flat buffer per batch, one per weight update. A private pair per
  node, not one global group, so a node that dies or restarts never poisons the others, and
  the user's own default process group (DDP in the trainer) is left alone.

A receive is posted only after the control channel announced the tensor, so no receive
waits for long: torch.distributed cannot cancel one, and one pending at exit aborts the
process.
"""

from __future__ import annotations

import math
import os
import pickle
import socket
import struct
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from .._core._shm import Layout, layout_nbytes

__all__ = [
    "BACKENDS",
    "DATA_TAG",
    "WEIGHTS_TAG",
    "Beat",
    "Hello",
    "NodePid",
    "Preempt",
    "Reject",
    "Setup",
    "Stop",
    "WeightsLayout",
    "flat_views",
    "gloo_device",
    "pair_group",
    "recv_frame",
    "send_frame",
]

BACKENDS = ("gloo", "nccl", "mpi")
DATA_TAG, WEIGHTS_TAG = 1, 2
_HEADER = struct.Struct("!Q")


# -- records only this transport uses (the engine never sees them) -----------------------------
@dataclass(frozen=True)
class Hello:
    """Node -> trainer, first frame: who is connecting."""

    rank: int
    token: str
    pid: int
    host: str  # the node's address as the trainer sees it (also where its data socket binds)
    hostname: str
    world_size: int | None = None  # torchrun's WORLD_SIZE where the node was given one


@dataclass(frozen=True)
class Reject:
    """Trainer -> node, instead of `Setup`: why this node cannot join (it exits with the reason)."""

    reason: str


@dataclass(frozen=True)
class Setup:
    """Trainer -> node, after `Hello`: join pair group ``prefix``, then run ``spec``."""

    prefix: str
    backend: str
    timeout: float
    worker_main: str  # "module:function" run as ``function(channel, spec)``
    spec: bytes
    weights_layout: Any
    weights_follow: bool  # published weights follow on the pair group before any command
    beat_interval: float
    cuda_device: int | None = None  # NCCL, a node on the trainer's machine: the GPU it takes


@dataclass(frozen=True)
class WeightsLayout:
    """Trainer -> node, before its first `ApplyWeights`: the weights' ``[(key, shape, dtype)]``.

    Sent to a node that joined before the trainer knew the layout (its policy is built by a
    ``policy_factory``, and the first update's weights laid them out): the node allocates its
    receive buffer from it, then the weights follow on the pair group as usual.
    """

    layout: Any


@dataclass(frozen=True)
class Beat:
    """Node -> trainer: its progress count and busy flag (sent when they change)."""

    progress: int
    busy: bool


@dataclass(frozen=True)
class Preempt:
    """Trainer -> node: cut request ``seq`` short (a control word, not a queued command)."""

    seq: int


@dataclass(frozen=True)
class Stop:
    """Trainer -> node: cut any batch short; `Close` follows."""


class NodePid(int):
    """A node's process id that also says where it runs, for error messages."""

    host: str
    rank: int

    def __new__(cls, pid: int, host: str, rank: int) -> NodePid:
        self = super().__new__(cls, pid)
        self.host, self.rank = host, rank
        return self

    def __str__(self) -> str:
        return f"{int(self)} on {self.host}, rank {self.rank}"

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else int.__format__(self, spec)

    def __reduce__(self) -> Any:
        return (NodePid, (int(self), self.host, self.rank))


# -- framing -----------------------------------------------------------------------------------
def send_frame(sock: socket.socket, obj: Any, lock: threading.Lock) -> None:
    """Send one record (atomically with respect to other senders holding ``lock``)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    with lock:
        sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the connection was closed")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket) -> Any:
    """Block until the next record arrives; ``EOFError`` when the peer closed the connection."""
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return pickle.loads(_recv_exact(sock, n))


# -- tensors -----------------------------------------------------------------------------------
def flat_views(buffer: torch.Tensor, layout: Layout, offset: int = 0) -> dict[Any, torch.Tensor]:
    """Typed views of a flat ``uint8`` ``buffer`` laid out as `layout_nbytes` describes.

    One buffer per batch lets a whole batch cross the pair group in one send.
    """
    out: dict[Any, torch.Tensor] = {}
    for key, shape, dtype in layout:
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = math.prod(shape) * itemsize
        out[key] = buffer[offset : offset + nbytes].view(dtype).view(shape)
        offset += layout_nbytes([(key, shape, dtype)])
    return out


def flat_buffer(layout: Layout, device: Any = "cpu") -> torch.Tensor:
    """A zeroed flat buffer for one copy of ``layout`` (at least one byte)."""
    return torch.zeros(max(1, layout_nbytes(layout)), dtype=torch.uint8, device=device)


# -- pair groups -------------------------------------------------------------------------------
def gloo_device(host: str) -> Any:
    """A gloo transport device bound to ``host`` (or the interface ``GLOO_SOCKET_IFNAME`` names).

    Each device runs its own event-loop thread, which its destruction joins (about 10 ms, the
    loop's poll interval, with the GIL held): a trainer shares one among all its pair groups so
    that closing many nodes does not pay that once per node, serially.
    """
    import torch.distributed as dist

    iface = os.environ.get("GLOO_SOCKET_IFNAME")
    if iface:
        return dist.ProcessGroupGloo.create_device(interface=iface.split(",")[0])
    return dist.ProcessGroupGloo.create_device(hostname=host)


def pair_group(store: Any, prefix: str, rank: int, backend: str, host: str, timeout: float, device: Any = None) -> Any:
    """The two-member process group ``prefix`` of ``store``, as ``rank`` (0: trainer, 1: node).

    Blocks until both members joined (or ``timeout`` seconds). Gloo binds to ``host``, the
    address the peer reaches this process at, unless ``GLOO_SOCKET_IFNAME`` names an interface;
    ``device`` (from `gloo_device`) shares one gloo device among several groups.
    """
    import torch.distributed as dist

    prefixed = dist.PrefixStore(f"aiocollect/{prefix}/", store)
    if backend == "gloo":
        # torch's stubs call this class ProcessGroupGloo.Options; at runtime that name is
        # Backend.Options (which Gloo does not take), and Gloo's own is _Options.
        opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        opts._timeout = timedelta(seconds=timeout)
        opts._devices = [device if device is not None else gloo_device(host)]
        return dist.ProcessGroupGloo(prefixed, rank, 2, opts)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout)
        return dist.ProcessGroupNCCL(prefixed, rank, 2, opts)
    raise ValueError(f"backend {backend!r} cannot form a pair group; use 'gloo' (CPU) or 'nccl' (GPU)")


def data_device(backend: str) -> torch.device:
    """Where tensors crossing the pair group live: host memory for gloo, this process's GPU for nccl."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")

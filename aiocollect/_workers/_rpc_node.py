"""The node side of the torch RPC transport: the process entry point and the remote functions.

A node process joins the trainer's RPC group (``rpc.init_rpc``) and then only serves calls:
the trainer hosts a `NodeHost` in it (`host_create`), drives it (`host_call`), drops it
(`host_drop`) and finally tells the process to leave (`node_exit`). Every function here runs
on one of the RPC agent's threads. Imports neither anyio nor the engine.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from typing import Any

from ._remote_node import HostSetup, NodeHost

__all__ = [
    "TENSORPIPE_DEFAULTS",
    "host_call",
    "host_create",
    "host_drop",
    "init_rpc_quietly",
    "node_exit",
    "node_name",
    "rpc_node_main",
]

#: TensorPipe options of every member unless ``tensorpipe_options`` says otherwise (TorchRL's).
TENSORPIPE_DEFAULTS = {"num_worker_threads": 16}

_HOSTS: dict[str, NodeHost] = {}
_EXIT = threading.Event()


def node_name(session: str, rank: int) -> str:
    """The RPC worker name of node ``rank`` of a group (the trainer is rank 0).

    Names are unique per group: torch numbers the all-gathers of a set of names per
    process, so a trainer's second group must not reuse the first one's names.
    """
    return f"aiocollect-{session}-trainer" if rank == 0 else f"aiocollect-{session}-node-{rank}"


def backend_options(master_addr: str, port: int, timeout: float, extra: dict[str, Any]) -> Any:
    """TensorPipe options of every member: the trainer's rendezvous address, then ``extra``."""
    import torch.distributed.rpc as rpc

    return rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{master_addr}:{port}", rpc_timeout=timeout, **extra)


def init_rpc_quietly(name: str, rank: int, world_size: int, options: Any) -> None:
    """``rpc.init_rpc``, without the deprecation warning torch's own code triggers inside it."""
    import warnings

    import torch.distributed.rpc as rpc

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)


def rpc_node_main(
    master_addr: str,
    port: int,
    rank: int,
    world_size: int,
    timeout: float,
    extra: dict[str, Any],
    generation: int,
    session: str,
) -> None:
    """Join the trainer's RPC group as node ``rank`` and serve it until it says `node_exit`.

    ``generation`` is how many RPC groups the trainer's process formed before this one:
    torch prefixes a group's rendezvous keys with that per-process count, so a fresh node
    process must use the trainer's, or a trainer's second collector never forms its group.
    """
    import torch.distributed.rpc as rpc

    with rpc._init_counter_lock:
        rpc._init_counter = generation
    # A launcher starts nodes as daemon processes, but a node's own collector starts
    # worker processes: allow it to.
    multiprocessing.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    _EXIT.clear()  # a process that hosted a node of an earlier group (a reused Ray worker)
    init_rpc_quietly(node_name(session, rank), rank, world_size, backend_options(master_addr, port, timeout, extra))
    try:
        _EXIT.wait()
    finally:
        for key in list(_HOSTS):
            host_drop(key, 1.0)
        rpc.shutdown(graceful=False)


def host_create(key: str, setup: HostSetup) -> tuple[int, str, str]:
    """Host a node's worker loop under ``key``; returns `NodeHost.info`."""
    host = _HOSTS[key] = NodeHost(setup)
    return host.info()


def host_call(key: str, method: str, *args: Any) -> Any:
    """``NodeHost.<method>(*args)`` of the host under ``key``."""
    return getattr(_HOSTS[key], method)(*args)


def host_drop(key: str, timeout: float) -> bool:
    """Stop the host under ``key`` and forget it; True if its loop ended within ``timeout``."""
    host = _HOSTS.pop(key, None)
    return True if host is None else host.close(timeout)


def node_exit() -> int:
    """Make this node process leave once the call has returned; returns its pid."""
    _EXIT.set()
    return os.getpid()

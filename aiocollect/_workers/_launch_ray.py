"""``launcher="ray"``: collection nodes started as Ray tasks, which then join the trainer as any node does.

The distributed and RPC transports use it like the other launchers: a Ray task runs the
transport's node main (`node_main` or `rpc_node_main`), which connects to the trainer's
address and port. The task's `ObjectRef` stands for the node process: its done-callback
closes a pipe whose read end is the node's sentinel, so the transports watch a Ray node
exactly as they watch a local process, without polling Ray.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ._launch import Launcher
from ._ray_common import acquire_ray, check_ray_options, release_ray

__all__ = ["RayLauncher", "check_ray_launcher_options", "check_ray_node_count", "ray_master_addr"]

#: Resources of a node task unless ``remote_configs`` says otherwise (one CPU, as TorchRL's actors).
DEFAULT_NODE_CONFIG: dict[str, Any] = {"num_cpus": 1}


def check_ray_launcher_options(out: dict[str, Any]) -> None:
    """Validate ``ray_init_config`` / ``remote_configs`` in ``out`` (a transport's options) in place."""
    init, configs = out.get("ray_init_config"), out.get("remote_configs")
    if out["launcher"] != "ray":
        for key, value in (("ray_init_config", init), ("remote_configs", configs)):
            if value is not None:
                raise ValueError(f"{key} is only for launcher='ray', got launcher={out['launcher']!r}")
        return
    if importlib.util.find_spec("ray") is None:
        raise RuntimeError('launcher="ray" needs Ray: pip install "aiocollect[ray]" (or pip install ray)')
    if init is not None and not isinstance(init, Mapping):
        raise TypeError(f"ray_init_config must be a dict of ray.init arguments or None, got {init!r}")
    out["ray_init_config"] = dict(init or {})
    if configs is None:
        configs = DEFAULT_NODE_CONFIG
    listed = configs if isinstance(configs, (list, tuple)) else [configs]
    if not all(isinstance(c, Mapping) for c in listed):
        raise TypeError(f"remote_configs must be a dict of Ray task options (or one per node) or None, got {configs!r}")
    for c in listed:
        for key in ("max_retries", "retry_exceptions", "max_calls"):
            if key in c:
                raise ValueError(
                    f"remote_configs sets {key!r}, which the launcher sets (a node task is never retried by Ray, "
                    "and its process ends with it; pass restart_nodes= to restart dead nodes)"
                )
        check_ray_options(_run_node, c)
    out["remote_configs"] = [dict(c) for c in listed]


def ray_is_local(init_config: Mapping[str, Any]) -> bool:
    """Whether the collector will start its own local Ray (no cluster address given or in the environment)."""
    return init_config.get("address") is None and not os.environ.get("RAY_ADDRESS")


def check_ray_node_count(options: Mapping[str, Any], num_workers: int) -> None:
    """A list of ``remote_configs`` has one dict per node (or a single one, for all)."""
    if options.get("launcher") != "ray":
        return
    configs = options["remote_configs"]  # a list, once check_ray_launcher_options ran
    if len(configs) not in (1, num_workers):
        raise ValueError(f"remote_configs lists {len(configs)} dicts for {num_workers} nodes; give one per node")


def ray_master_addr(init_config: Mapping[str, Any]) -> str:
    """The trainer's address for Ray nodes to reach: loopback on a local Ray, the host's on a cluster."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # the user's Ray: the driver's address on it
        return str(ray.util.get_node_ip_address())
    if ray_is_local(init_config):
        return "127.0.0.1"
    return socket.gethostbyname(socket.gethostname())


def _run_node(main: Callable[..., None], args: tuple[Any, ...]) -> None:
    main(*args)


class RayLauncher(Launcher):
    """Nodes as Ray tasks: on the cluster at ``ray_init_config["address"]``, or a local Ray started here."""

    def __init__(
        self, init_config: dict[str, Any], configs: list[dict[str, Any]], main: Callable[..., None] | None
    ) -> None:
        import ray

        self._release = acquire_ray(init_config)
        self._main = main
        self._configs = configs
        # One task per worker process: the node's process state (torch's process group or
        # RPC agent, GPU memory) ends with it, instead of lingering in Ray's worker pool.
        self._remote = ray.remote(max_calls=1)(_run_node)
        self._refs: dict[int, Any] = {}
        self._pipes: dict[int, tuple[int, int]] = {}  # rank -> (read end: the sentinel, write end)
        self._codes: dict[int, int | None] = {}
        self._killed: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False

    def launch(self, rank: int, args: tuple[Any, ...]) -> None:
        from ._distributed_node import node_main

        config = self._configs[(rank - 1) % len(self._configs)]
        options = {**config, "max_retries": 0, "retry_exceptions": False}
        r, w = os.pipe()
        with self._lock:
            self._close_pipe(rank)
            self._pipes[rank] = (r, w)
            self._codes.pop(rank, None)
            self._killed.discard(rank)
            ref = self._remote.options(**options).remote(self._main or node_main, args)
            self._refs[rank] = ref
        ref.future().add_done_callback(lambda f: self._ended(rank, w, f))

    def _ended(self, rank: int, w: int, future: Any) -> None:
        try:
            future.result()
            code: int | None = 0
        except BaseException:
            # Ray does not say how the process ended; a kill of ours is a SIGKILL.
            code = -9 if rank in self._killed else None
        with self._lock:
            pipe = self._pipes.get(rank)
            if pipe is None or pipe[1] != w:
                return  # a relaunched node's pipe: not this task's
            self._codes[rank] = code
            os.close(w)
            self._pipes[rank] = (pipe[0], -1)

    def _close_pipe(self, rank: int) -> None:
        pipe = self._pipes.pop(rank, None)
        if pipe is not None:
            for fd in pipe:
                if fd >= 0:
                    os.close(fd)

    def sentinel(self, rank: int) -> int | None:
        pipe = self._pipes.get(rank)
        return None if pipe is None else pipe[0]

    def exitcode(self, rank: int) -> int | None:
        return self._codes.get(rank)

    def kill(self, rank: int) -> None:
        import ray

        ref = self._refs.get(rank)
        if ref is not None and rank not in self._codes:
            self._killed.add(rank)
            try:
                ray.cancel(ref, force=True)
            except Exception:  # it has ended meanwhile, or Ray is gone and the task with it
                pass

    def reap(self, rank: int, timeout: float) -> None:
        import ray

        ref = self._refs.get(rank)
        if ref is None:
            return
        ready, _ = ray.wait([ref], timeout=timeout)
        if not ready:
            self.kill(rank)
            ray.wait([ref], timeout=5.0)
        with self._lock:
            self._refs.pop(rank, None)

    def close(self) -> None:
        import ray

        with self._lock:
            if self._closed:
                return
            self._closed = True
        for rank in list(self._refs):
            self.kill(rank)
        refs = list(self._refs.values())
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=5.0)
        with self._lock:
            self._refs.clear()
            for rank in list(self._pipes):
                self._close_pipe(rank)
        if self._release:
            release_ray()

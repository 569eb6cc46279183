"""The options of the distributed transport: defaults and validation, run before anything starts."""

from __future__ import annotations

import importlib.util
import math
import os
import socket
from collections.abc import Mapping
from typing import Any

import torch

from ._launch_delayed import apply_delayed_context
from ._launch_ray import check_ray_launcher_options, ray_master_addr
from ._launchers import LAUNCHERS
from ._subprocess import START_METHODS, _default_start_method
from ._wire import BACKENDS

__all__ = ["check_main_and_times", "check_options", "check_port", "master_addr"]

_DEFAULT_MAIN = "aiocollect._workers._loop:run_worker"
OPTIONS = {
    "backend": "gloo", "launcher": "mp", "start_method": None, "master_addr": None, "tcp_port": None,
    "node_hosts": None, "slurm_kwargs": None, "submitit_folder": "aiocollect_submitit", "worker_main": _DEFAULT_MAIN,
    "join_timeout": 300.0, "beat_interval": 0.5, "ray_init_config": None, "remote_configs": None,
    "delayed": None,  # set from the environment with launcher="submitit_delayed"
    "fork_server_in_nodes": False,  # set by the distributed collectors (see fork_forkserver)
}  # fmt: skip


def _check_backend(backend: Any) -> str:
    import torch.distributed as dist

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed; install a build with distributed support")
    if backend == "mpi":
        if not dist.is_mpi_available():
            raise RuntimeError(
                "backend='mpi' needs a torch build with MPI, and this one has none; use backend='gloo' (CPU tensors)"
            )
        raise ValueError(
            "backend='mpi' needs every process started by mpirun, which this collector's launchers do not do; "
            "use backend='gloo' (CPU) or 'nccl' (GPU)"
        )
    if backend == "nccl" and not (dist.is_nccl_available() and torch.cuda.is_available()):
        raise RuntimeError("backend='nccl' needs CUDA and a torch build with NCCL; use backend='gloo' on CPU machines")
    return str(backend)


def check_local_nccl(options: Mapping[str, Any]) -> None:
    """Nodes started on this machine (``launcher="mp"``) need a GPU other than the trainer's for NCCL.

    NCCL refuses two members of one group on one device (and may hang instead), and each
    node's pair group holds the trainer; nodes may share a GPU among themselves.
    """
    if options["backend"] != "nccl" or options["launcher"] != "mp":
        return
    count = torch.cuda.device_count()
    if count < 2:
        raise ValueError(
            f"backend='nccl' with launcher='mp' needs at least 2 GPUs (the trainer's and one for the nodes: NCCL "
            f"cannot pair two processes on one GPU), and this machine has {count}; use backend='gloo' (batches "
            "cross in host memory and storing_device='cuda' moves them), or start the nodes on other machines"
        )


def local_node_gpu(rank: int) -> int:
    """The GPU a node started on the trainer's machine takes: any but the trainer's, round robin."""
    mine = torch.cuda.current_device()
    others = [d for d in range(torch.cuda.device_count()) if d != mine]
    return others[(rank - 1) % len(others)]


def _check_address(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a host name or IP address string, got {value!r}")
    return value


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The distributed transport's options, defaults filled in; raises on a bad one, before anything starts."""
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"the distributed backend takes no option {sorted(unknown)[0]!r}; it takes {sorted(OPTIONS)}")
    out = {**OPTIONS, **{k: v for k, v in options.items() if v is not None}}
    out["backend"] = _check_backend(out["backend"])
    if out["launcher"] not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {', '.join(map(repr, LAUNCHERS))}, got {out['launcher']!r}")
    if out["launcher"] == "submitit":
        if importlib.util.find_spec("submitit") is None:
            raise RuntimeError("launcher='submitit' needs submitit: pip install submitit")
    check_ray_launcher_options(out)
    if out["launcher"] == "submitit_delayed":
        apply_delayed_context(out, "distributed", out["backend"])
    check_local_nccl(out)
    out["slurm_kwargs"] = dict(out["slurm_kwargs"] or {})
    method = out["start_method"] or _default_start_method()
    if method not in START_METHODS:
        raise ValueError(f"start_method must be 'forkserver' or 'spawn' (fork is unsafe with threads), got {method!r}")
    out["start_method"] = method
    port = out["tcp_port"]
    if port is None and out["launcher"] == "external":
        port = os.environ.get("MASTER_PORT")
        if port is None:
            raise ValueError(
                "launcher='external' needs a known port for nodes to reach: pass tcp_port=29500 (any free port)"
            )
    out["tcp_port"] = check_port(port)
    out["master_addr"] = master_addr(out)
    hosts = out["node_hosts"]
    if hosts is not None:
        if isinstance(hosts, str) or not all(isinstance(h, str) and h for h in hosts):
            raise TypeError(f"node_hosts must be a list of addresses (one per node) or None, got {hosts!r}")
        out["node_hosts"] = list(hosts)
    check_main_and_times(out)
    return out


def check_port(port: Any) -> int | None:
    """``tcp_port`` as an int, or ``None`` (any free port)."""
    if port is None:
        return None
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise TypeError(f"tcp_port must be an int in [1, 65535] or None (any free port), got {port!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"tcp_port must be an int in [1, 65535] or None (any free port), got {port!r}")
    return port


def master_addr(out: Mapping[str, Any]) -> str:
    """The trainer's address for nodes: ``master_addr``, ``MASTER_ADDR``, or the launcher's default."""
    addr = out["master_addr"] or os.environ.get("MASTER_ADDR")
    if addr is None and out["launcher"] == "ray":
        addr = ray_master_addr(out["ray_init_config"])
    if addr is None:
        addr = "127.0.0.1" if out["launcher"] == "mp" else socket.gethostbyname(socket.gethostname())
    return _check_address("master_addr", addr)


def check_main_and_times(out: Mapping[str, Any]) -> None:
    """``worker_main`` names a function; ``join_timeout`` and ``beat_interval`` are positive seconds."""
    module, sep, name = str(out["worker_main"]).partition(":")
    if not (module and sep and name):
        raise ValueError(f"worker_main must be 'module:function', got {out['worker_main']!r}")
    for key in ("join_timeout", "beat_interval"):
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise ValueError(f"{key} must be a positive number of seconds, got {value!r}")

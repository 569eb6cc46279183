"""`submitit_delayed_launcher`: launch the collection nodes as submitit jobs around the main function."""

from __future__ import annotations

import functools
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .._core._validate import check_int
from .._workers._launch import DEFAULT_SLURM_CONF, cancel_job, end_job, submitit_executor

__all__ = ["DEFAULT_SLURM_CONF_MAIN", "submitit_delayed_launcher"]

T = TypeVar("T")

#: TorchRL's SLURM defaults for the main (trainer) job, which ``submitit_main_conf`` updates.
DEFAULT_SLURM_CONF_MAIN = {"timeout_min": 10, "slurm_partition": "train", "cpus_per_task": 32, "gpus_per_node": 1}

_FRAMEWORKS = ("distributed", "rpc")


class submitit_delayed_launcher:  # lower case: TorchRL's name, and it is used as a decorator
    """Run the main function as a submitit job, with ``num_jobs`` collection nodes as jobs beside it.

    For clusters where a job cannot submit jobs: decorate the training script's main
    function, and call it from where you submit jobs (a login node). The call submits main
    as a job; once it runs, and has picked its address and a free port, the decorator
    submits the node jobs, which connect to it. Inside main, build the collector with
    ``launcher="submitit_delayed"`` (`DistributedCollector`, `DistributedSyncCollector` for
    ``framework="distributed"``, `RPCCollector` for ``"rpc"``); it checks that framework,
    backend and number of nodes match what was launched, and says so if not (TorchRL's
    version hangs). The call returns main's result once main's job has ended, and ends the
    node jobs then (they leave when their collector closes; any left are cancelled).

    Where there is no SLURM, submitit's local executor runs the jobs as local processes,
    so the same script runs on a laptop.

    Args:
        num_jobs: Collection nodes (one job each).
        framework: ``"distributed"`` (torch.distributed process group) or ``"rpc"``.
        backend: The collector's backend (``"gloo"`` or ``"nccl"`` with ``"distributed"``).
        tcpport: The port nodes connect to (default: a free port on main's host).
        submitit_main_conf: submitit parameters of main's job, over `DEFAULT_SLURM_CONF_MAIN`.
        submitit_collection_conf: submitit parameters of each node job, over TorchRL's node
            defaults (10 min, partition ``train``, 32 CPUs, no GPU).
        folder: Where submitit keeps job files and logs.
        node_timeout: Seconds a node waits for main's collector to take it.

    Example:
        >>> from aiocollect import DistributedCollector, submitit_delayed_launcher
        >>> @submitit_delayed_launcher(num_jobs=2)
        ... def main():
        ...     import anyio
        ...     async def train():
        ...         async with DistributedCollector(make_env, policy, frames_per_batch=200, total_frames=10_000,
        ...                                         num_nodes=2, launcher="submitit_delayed") as c:
        ...             async for batch in c:
        ...                 ...
        ...     anyio.run(train)
        >>> if __name__ == "__main__":
        ...     main()
    """

    def __init__(
        self,
        num_jobs: int,
        framework: str = "distributed",
        backend: str = "gloo",
        tcpport: int | None = None,
        submitit_main_conf: dict[str, Any] | None = None,
        submitit_collection_conf: dict[str, Any] | None = None,
        *,
        folder: str = "aiocollect_submitit",
        node_timeout: float = 300.0,
    ) -> None:
        import importlib.util

        self.num_jobs = check_int("num_jobs", num_jobs, minimum=1)
        if framework not in _FRAMEWORKS:
            raise ValueError(f"framework must be 'distributed' or 'rpc', got {framework!r}")
        if framework == "rpc" and backend != "gloo":
            raise ValueError(
                f"framework='rpc' carries tensors in RPC messages, so backend must be 'gloo', got {backend!r}"
            )
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if tcpport is not None:
            tcpport = check_int("tcpport", int(tcpport), minimum=1, rule="a port in [1, 65535] or None (a free one)")
            if tcpport > 65535:
                raise ValueError(f"tcpport must be a port in [1, 65535] or None (a free one), got {tcpport}")
        for name, conf in (
            ("submitit_main_conf", submitit_main_conf),
            ("submitit_collection_conf", submitit_collection_conf),
        ):
            if conf is not None and not isinstance(conf, dict):
                raise TypeError(f"{name} must be a dict of submitit parameters or None, got {conf!r}")
        if importlib.util.find_spec("submitit") is None:
            raise RuntimeError("submitit_delayed_launcher needs submitit: pip install submitit")
        self.framework, self.backend, self.tcpport = framework, backend, tcpport
        self.main_conf = {**DEFAULT_SLURM_CONF_MAIN, **(submitit_main_conf or {})}
        self.node_conf = {**DEFAULT_SLURM_CONF, **(submitit_collection_conf or {})}
        self.folder, self.node_timeout = folder, float(node_timeout)

    def __call__(self, main: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(main)
        def launch(*args: Any, **kwargs: Any) -> T:
            return self._run(main, args, kwargs)

        return launch

    def _run(self, main: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        import submitit

        from .._workers._launch_delayed import delayed_main, delayed_node

        local = submitit.AutoExecutor.which() != "slurm"
        Path(self.folder).mkdir(parents=True, exist_ok=True)
        rendezvous = os.path.join(os.path.abspath(self.folder), f"rendezvous-{secrets.token_hex(8)}.json")
        context = {
            "framework": self.framework,
            "backend": self.backend,
            "num_jobs": self.num_jobs,
            "port": self.tcpport,
        }
        main_job = submitit_executor(self.folder, self.main_conf).submit(
            delayed_main, main, args, kwargs, context, rendezvous, local
        )
        nodes: list[Any] = []
        try:
            ctx = self._wait_for_main(main_job, rendezvous)
            executor = submitit_executor(self.folder, self.node_conf)
            nodes = [
                executor.submit(delayed_node, ctx, rank, self.node_timeout) for rank in range(1, self.num_jobs + 1)
            ]
            result: T = main_job.result()
        except BaseException:
            for job in [main_job, *nodes]:
                cancel_job(job)
            raise
        finally:
            for job in nodes:  # they leave when main's collector closes; end_job cancels stragglers
                end_job(job, 5.0)
            end_job(main_job, 5.0)
            Path(rendezvous).unlink(missing_ok=True)
        return result

    @staticmethod
    def _wait_for_main(job: Any, rendezvous: str) -> dict[str, Any]:
        """Main's address and port, once its job runs (it may wait in a queue for long)."""
        import json

        # submitit itself learns of job states by polling; a file on the shared filesystem
        # is how main's job tells its address, so it is polled too (10 times a second).
        while not os.path.exists(rendezvous):
            if job.done():
                job.result()  # raises main's failure
                raise RuntimeError("the main job ended before it published its address")
            time.sleep(0.1)
        with open(rendezvous) as f:
            return dict(json.load(f))

"""The Ray transport: each node is a Ray actor hosting the node's worker loop.

A node is a threaded actor of `NodeHost` (``_remote_node``), so its long poll, the
trainer's commands and a stop run side by side. Calls are made with ``.remote()`` and their
``ObjectRef`` is never awaited on the event loop: its ``future()`` completes in Ray's own
thread, which queues the result and wakes the loop (the same under asyncio and trio, and
with no thread per request). Weights go into the object store once per update
(``ray.put``); every actor's push carries the same reference.

Ray itself is started only when no instance is connected in this process (``ray.init`` with
``ray_init_config``) or connected to when an ``address`` is given, and shut down by the
last collector that started it; a Ray instance the user started is never shut down.
Actors are created with ``max_restarts=0``: a dead actor is restarted, if at all, by the
collector's supervision (``restart_nodes``), which re-seeds it and gives it the current
weights before it collects.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from ._distributed_options import check_main_and_times
from ._ray_common import acquire_ray, check_ray_options, release_ray
from ._remote import Done, RemoteTransport
from ._remote_node import HostSetup, NodeHost

__all__ = ["RayTransport", "transport_class"]

_DEFAULT_MAIN = "aiocollect._workers._loop:run_worker"
OPTIONS = {
    "ray_init_config": None, "remote_configs": None, "worker_main": _DEFAULT_MAIN, "join_timeout": 300.0,
    "beat_interval": 0.5,
    "fork_server_in_nodes": False,  # set by the distributed collectors; actors never fork (Ray's threads)
}  # fmt: skip
# Threads per actor: the long poll, a command, a stop and `info` may all be running at once.
_CONCURRENCY = 8


def default_remote_config() -> dict[str, Any]:
    """TorchRL's default actor resources: one CPU, 2 GiB, a fifth of a GPU where there is one."""
    import torch

    config: dict[str, Any] = {"num_cpus": 1, "memory": 2 * 1024**3}
    if torch.cuda.is_available():
        config["num_gpus"] = 0.2
    return config


def check_options(options: Mapping[str, Any], num_workers: int | None = None) -> dict[str, Any]:
    """The Ray transport's options, defaults filled in; raises on a bad one, before anything starts."""
    options = {k: v for k, v in options.items() if v is not None}  # None: the default
    unknown = set(options) - set(OPTIONS)
    if unknown:
        raise TypeError(f"the ray backend takes no option {sorted(unknown)[0]!r}; it takes {sorted(OPTIONS)}")
    out = {**OPTIONS, **options}
    if importlib.util.find_spec("ray") is None:
        raise RuntimeError('Ray is not installed: pip install "aiocollect[ray]" (or pip install ray)')
    init = out["ray_init_config"] or {}
    if not isinstance(init, Mapping):
        raise TypeError(f"ray_init_config must be a dict of ray.init arguments or None, got {init!r}")
    out["ray_init_config"] = dict(init)
    configs = out["remote_configs"]
    if configs is None:
        configs = default_remote_config()
    listed = configs if isinstance(configs, (list, tuple)) else [configs]
    if not all(isinstance(c, Mapping) for c in listed):
        raise TypeError(f"remote_configs must be a dict of actor options (or one per node) or None, got {configs!r}")
    if num_workers is not None:
        if isinstance(configs, Mapping):
            listed = [configs] * num_workers
        elif len(listed) != num_workers:
            raise ValueError(f"remote_configs lists {len(listed)} dicts for {num_workers} nodes; give one per node")
    for c in listed:
        for key in ("max_concurrency", "max_restarts", "concurrency_groups"):
            if key in c:
                raise ValueError(
                    f"remote_configs sets {key!r}, which the collector manages for its actors"
                    + ("; pass restart_nodes= to restart dead actors" if key == "max_restarts" else "")
                )
    for c in listed:
        check_ray_options(NodeHost, c)
    out["remote_configs"] = (
        dict(configs) if isinstance(configs, Mapping) and num_workers is None else [dict(c) for c in listed]
    )
    check_main_and_times(out)
    return out


def _outcome(future: Any) -> tuple[Any, BaseException | None]:
    try:
        return future.result(), None
    except BaseException as exc:  # handed to the transport, which reports it
        return None, exc


class RayTransport(RemoteTransport):
    """Nodes are Ray actors (`NodeHost`), on a local Ray instance or a cluster."""

    kills_hosts = True  # `ray.kill` ends each actor once its loop has ended

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        return check_options(options)

    def __init__(self, num_workers: int, options: dict[str, Any], weights_layout: Any) -> None:
        super().__init__(num_workers, options, weights_layout)
        self._configs = check_options(options, num_workers)["remote_configs"]
        self._leased = False
        self._weights_ref: Any = None
        self._actor_class: Any = None

    def _open(self) -> None:
        import ray

        self._leased = acquire_ray(self.options["ray_init_config"])
        self._actor_class = ray.remote(NodeHost)

    def _create(self, w: int, setup: HostSetup) -> tuple[Any, tuple[int, str, str]]:
        import ray

        options = {**self._configs[w], "max_concurrency": _CONCURRENCY, "max_restarts": 0}
        actor = self._actor_class.options(**options).remote(setup)
        try:
            info = ray.get(actor.info.remote(), timeout=self.options["join_timeout"])
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        return actor, info

    async def _start_failure(self, w: int, exc: Exception) -> BaseException:
        import ray

        if isinstance(exc, ray.exceptions.GetTimeoutError):
            return TimeoutError(
                f"node {w}'s Ray actor was not running within join_timeout={self.options['join_timeout']}s: Ray "
                f"found no room for remote_configs {self._configs[w]} (compare ray.available_resources()), or "
                "it is still starting; lower the request or raise join_timeout"
            )
        if isinstance(exc, ray.exceptions.RayActorError):
            return await super()._start_failure(w, exc)
        return RuntimeError(f"node {w}'s Ray actor could not be created: {exc}")

    def _call(self, handle: Any, method: str, args: tuple[Any, ...], done: Done) -> None:
        ref = getattr(handle, method).remote(*args)
        ref.future().add_done_callback(lambda f: done(*_outcome(f)))

    def _destroy(self, w: int, handle: Any, timeout: float) -> None:
        import ray

        try:
            ray.kill(handle, no_restart=True)  # its loop has ended (or overran the deadline)
        except Exception:  # Ray is already gone, and the actor with it
            pass

    def _close_engine(self) -> None:
        self._weights_ref = None
        if self._leased:
            self._leased = False
            release_ray()

    def publish_weights(self, state: Any, version: int) -> None:
        import ray

        super().publish_weights(state, version)
        # One copy in the object store per update, whatever the number of actors.
        self._weights_ref = ray.put(self._weights) if self._opened else None

    def _weights_payload(self) -> Any:
        if self._weights_ref is None and self._weights is not None:
            import ray

            self._weights_ref = ray.put(self._weights)
        return self._weights_ref


transport_class = RayTransport

"""Argument handling of the distributed collectors: nodes, their collectors, weight-update rules.

Everything here runs in the constructor, before anything is launched, and raises
``TypeError``/``ValueError`` with the rule, the value and the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .._collect._weight_sync import check_recv_schemes, resolve_weight_sync
from .._core._validate import check_bool, check_int
from .._multi._config import MultiConfig, resolve_multi_config
from .._workers._launch_delayed import check_delayed_node_count
from .._workers._launch_ray import check_ray_node_count

__all__ = ["DistConfig", "resolve_dist_config"]

# The local collector's arguments that the distributed collector sets itself.
_OWNED = {
    "frames_per_batch", "total_frames", "policy", "policy_factory", "num_workers", "create_env_fn", "replay_buffer",
    "max_frames_per_traj", "init_random_frames", "reset_at_each_iter", "exploration_type", "device", "env_device",
    "policy_device",
}  # fmt: skip
# Complete-trajectory mode: the episodes are assembled in the trainer's process from the nodes'
# batches, so one setting holds for all nodes. TorchRL passes it to each node's collector, and
# a collector_kwargs entry is taken as given at the top level.
_TRAJ_ARGS = ("trajs_per_batch", "traj_format", "trajs_per_write")


@dataclass(frozen=True)
class DistConfig:
    """The validated arguments of a distributed collector."""

    mc: MultiConfig  # the engine's view: one "worker" per node
    collector_class: type
    workers_per_node: int
    node_fpb: int
    node_kwargs: list[dict[str, Any]]  # per node: the local collector's other arguments
    update_after_each_batch: bool
    max_weight_update_interval: int
    update_interval: int | None
    traj_args: dict[str, Any]  # trajs_per_batch, traj_format, trajs_per_write: the trainer's assembly


def _collector_class(value: Any) -> type:
    from .._collect._collector import Collector
    from .._multi._collectors import MultiAsyncCollector, MultiSyncCollector

    aliases = {"single": Collector, "sync": MultiSyncCollector, "async": MultiAsyncCollector}
    value = aliases.get(value, value) if isinstance(value, str) else value
    value = getattr(value, "_async_class", value)  # a blocking twin names its async class
    if value not in (Collector, MultiSyncCollector, MultiAsyncCollector):
        raise TypeError(
            "collector_class must be aiocollect's Collector, MultiSyncCollector or MultiAsyncCollector (or 'single', "
            f"'sync', 'async'), got {value!r}"
        )
    return value


def resolve_dist_config(
    name: str,
    *,
    create_env_fn: Any,
    num_nodes: Any,
    frames_per_batch: Any,
    collector_class: Any,
    collector_kwargs: Any,
    num_workers_per_collector: Any,
    update_after_each_batch: Any,
    max_weight_update_interval: Any,
    update_interval: Any,
    init_random_frames: Any,
    max_frames_per_traj: Any,
    reset_at_each_iter: Any,
    exploration_type: Any,
    transport_options: dict[str, Any],
    transport: str,
    gather: bool,
    on_demand: bool,
    weight_sync_schemes: Any = None,
    weight_updater: Any = None,
    weight_recv_schemes: Any = None,
    native_scheme: str = "DistributedWeightSyncScheme",
    traj_args: dict[str, Any] | None = None,
    node_options: dict[str, tuple[Any, Any]] | None = None,
    **engine: Any,
) -> DistConfig:
    """Validate a distributed collector's arguments (``engine`` goes to `resolve_multi_config`).

    ``gather``: every node's share is stacked into one batch; ``on_demand``: nodes collect only
    when asked (the engine then sends weights before each batch, not after it).
    ``native_scheme``: the TorchRL weight-sync scheme of this kind of collector, which the
    node transport honours. ``traj_args``: the trajectory-mode arguments as given at the top
    level (merged with collector_kwargs' into ``DistConfig.traj_args``). ``node_options``:
    ``{name: (value, default)}`` of more arguments of every node's collector.
    """
    from .._workers import get_transport

    weight_sync = resolve_weight_sync(
        name, weight_sync_schemes, weight_updater, workers=True, honoured=(native_scheme,)
    )
    check_recv_schemes(name, weight_recv_schemes)

    if isinstance(create_env_fn, (list, tuple)):
        check_int("num_nodes", num_nodes, allow_none=True)
        fns = list(create_env_fn)
        if num_nodes is not None and num_nodes != len(fns):
            raise ValueError(f"num_nodes={num_nodes!r} but create_env_fn lists {len(fns)} factories; drop num_nodes")
    else:
        check_int(
            "num_nodes",
            num_nodes,
            rule="a positive int when create_env_fn is a single factory (or pass one factory per node)",
        )
        fns = [create_env_fn] * num_nodes
    n = len(fns)
    if n == 0:
        raise ValueError("create_env_fn must list at least one env factory (one per node), got an empty list")
    fpb = check_int("frames_per_batch", frames_per_batch)
    if gather and fpb % n:
        raise ValueError(
            f"frames_per_batch={fpb} must split evenly across {n} nodes when every node's share is gathered; "
            f"use a multiple of {n}, e.g. {fpb + n - fpb % n}"
        )
    node_fpb = fpb // n if gather else fpb
    cls = _collector_class(collector_class)
    k = check_int("num_workers_per_collector", num_workers_per_collector)
    if cls.__name__ == "Collector" and k != 1:
        raise ValueError(
            f"num_workers_per_collector={k} needs collector_class=MultiSyncCollector or MultiAsyncCollector; "
            "Collector runs one env"
        )
    if collector_kwargs is None:
        kwargs_list: list[dict[str, Any]] = [{} for _ in range(n)]
    elif isinstance(collector_kwargs, dict):
        kwargs_list = [dict(collector_kwargs) for _ in range(n)]
    elif isinstance(collector_kwargs, (list, tuple)) and all(isinstance(d, dict) for d in collector_kwargs):
        if len(collector_kwargs) != n:
            raise ValueError(f"collector_kwargs lists {len(collector_kwargs)} dicts for {n} nodes; give one per node")
        kwargs_list = [dict(d) for d in collector_kwargs]
    else:
        raise TypeError(f"collector_kwargs must be a dict (or one per node) or None, got {collector_kwargs!r}")
    for d in kwargs_list:
        owned = sorted(set(d) & _OWNED)
        if owned:
            raise ValueError(
                f"collector_kwargs sets {owned[0]!r}, which the distributed collector sets for each node; pass it "
                f"to {name} instead"
            )
    traj = _merged_traj_args(name, dict(traj_args or {}), kwargs_list)
    # Given at the top level, they hold on every node (a collector_kwargs entry may not contradict them).
    shared = {
        key: (engine.get(key, default), default)
        for key, default in (("set_truncated", False), ("track_traj_ids", True))
    }
    for key, (value, default) in {**shared, **(node_options or {})}.items():
        if value is default or (not callable(value) and value == default):
            continue
        for d in kwargs_list:
            if key in d and d[key] is not value and (callable(value) or d[key] != value):
                raise ValueError(
                    f"{key}={value!r} contradicts collector_kwargs' {key}={d[key]!r}; give it in one place only"
                )
            d[key] = value
    check_bool("update_after_each_batch", update_after_each_batch)
    mwi = check_int("max_weight_update_interval", max_weight_update_interval, minimum=-1)
    if update_after_each_batch and mwi > -1:
        raise ValueError(
            "update_after_each_batch=True and max_weight_update_interval > -1 contradict each other; keep one of them"
        )
    if update_interval is not None:
        check_int("update_interval", update_interval, rule="a positive int (update every k batches) or None")
    random = check_int("init_random_frames", init_random_frames, minimum=-1, allow_none=True) or 0
    common = {
        "max_frames_per_traj": max_frames_per_traj, "reset_at_each_iter": reset_at_each_iter,
        "exploration_type": exploration_type,
    }  # fmt: skip
    mc = resolve_multi_config(
        sync=gather, create_env_fn=fns, num_workers=None, frames_per_batch=fpb, cat_results=None,
        update_at_each_batch=update_after_each_batch and on_demand, preemptive_threshold=None, num_sub_threads=1,
        start_method=None, backend=transport, create_env_kwargs=None, init_random_frames=None, **common, **engine,
    )  # fmt: skip
    options = get_transport(transport).check_options(
        {
            **transport_options,
            "worker_main": "aiocollect._dist._node:run_node",
            "fork_server_in_nodes": any(_forks_workers(cls, d) for d in kwargs_list),
        }
    )
    if options.get("node_hosts") is not None and len(options["node_hosts"]) != n:
        raise ValueError(f"node_hosts lists {len(options['node_hosts'])} addresses for {n} nodes; give one per node")
    check_ray_node_count(options, n)
    check_delayed_node_count(options, n)
    mc = dataclasses.replace(mc, transport_options=options, total_fpb=fpb, weight_sync=weight_sync)
    node_kwargs = [
        {
            # Nodes always record each frame's worker and policy version: the engine rewrites them
            # into global ids and versions (TorchRL envs included, whose own batches have none).
            "track_provenance": True,
            **d, **common, "init_random_frames": max(0, random) // n or None,
            "env_device": mc.worker_cfgs[w].env_device, "policy_device": mc.worker_cfgs[w].policy_device,
        }
        for w, d in enumerate(kwargs_list)
    ]  # fmt: skip
    return DistConfig(
        mc=mc, collector_class=cls, workers_per_node=k, node_fpb=node_fpb, node_kwargs=node_kwargs,
        update_after_each_batch=update_after_each_batch, max_weight_update_interval=mwi,
        update_interval=update_interval, traj_args=traj,
    )  # fmt: skip


def _merged_traj_args(name: str, top: dict[str, Any], kwargs_list: list[dict[str, Any]]) -> dict[str, Any]:
    """The trajectory-mode arguments: the top level's, or collector_kwargs' (one value for every node)."""
    out = {key: top.get(key) for key in _TRAJ_ARGS}
    for key in _TRAJ_ARGS:
        given = [d.pop(key) for d in kwargs_list if key in d]
        if not given:
            continue
        if len(given) != len(kwargs_list) or any(v != given[0] for v in given):
            raise ValueError(
                f"collector_kwargs gives {key} for some nodes or with different values, but {name} assembles "
                f"trajectories from every node's batches with one setting; pass {key}= to {name} instead"
            )
        if out[key] is not None and out[key] != given[0]:
            raise ValueError(
                f"{key}={out[key]!r} contradicts collector_kwargs' {key}={given[0]!r}; give it in one place only"
            )
        out[key] = given[0]
    return out


def _forks_workers(cls: type, kwargs: dict[str, Any]) -> bool:
    """Whether a node's collector ``cls``, given ``kwargs``, forks its workers from a fork server.

    Such a node forks that server from itself at its start (`fork_forkserver`), saving the new
    interpreter's imports. The default backend is read from ``cls``'s own signature, so that it
    is stated in one place. A wrong backend or start method is the node's collector's to report.
    """
    import inspect

    from .._workers import get_transport

    backend = inspect.signature(cls).parameters.get("backend")
    if backend is None or backend.default is None:
        return False  # `Collector` (whose backend only selects another class): no workers of its own
    try:
        transport = get_transport(kwargs.get("backend", backend.default))
        return transport.forks_from_server(transport.check_options({"start_method": kwargs.get("start_method")}))
    except (LookupError, TypeError, ValueError, RuntimeError):
        return False

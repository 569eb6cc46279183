"""Argument handling of the multi-process collectors: per-worker lists, TorchRL's extras.

Everything here runs in the constructor, before any process is spawned, and raises
``TypeError``/``ValueError`` with the rule, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._collect._weight_sync import DEFAULT_SYNC, WeightSync, check_recv_schemes, resolve_weight_sync
from .._core._validate import check_bool, check_int, check_seconds
from .._rollout._config import CollectorConfig, validate_config

__all__ = ["MultiConfig", "collector_options", "multi_signature", "resolve_multi_config"]


@dataclass(frozen=True)
class MultiConfig:
    """The validated arguments of a multi-process collector."""

    cfg: CollectorConfig  # the collector-level view (total budget, postproc, storing device)
    worker_cfgs: list[CollectorConfig]  # one per worker (its own env factory, devices, batch size)
    factories: list[Callable[[], Any] | None]
    cat: str | int | None
    total_fpb: int
    update_at_each_batch: bool
    preemptive_threshold: float | None
    num_threads: int | None
    num_sub_threads: int
    restart_workers: int
    weight_sync_timeout: float
    worker_timeout: float | None
    backend: str
    transport_options: dict[str, Any]  # validated by the backend's Transport.check_options
    weight_sync: WeightSync = DEFAULT_SYNC  # weight_sync_schemes / weight_updater
    init_fn: Callable[[], Any] | None = None  # called first in each worker (TorchRL's init_fn)

    @property
    def num_workers(self) -> int:
        return len(self.worker_cfgs)


#: `Collector` arguments a multi-worker collector does not take as they are: it declares its own
#: ``policy_factory`` (one per worker) and ``backend`` (where workers run), and the front
#: door's selectors choose a class, which is already chosen here.
_NOT_FORWARDED = frozenset({"policy_factory", "backend", "backend_options", "num_collectors", "sync"})


def _collector_parameters() -> dict[str, inspect.Parameter]:
    from .._collect._collector import Collector

    params = dict(inspect.signature(Collector.__init__).parameters)
    return {k: p for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and k not in _NOT_FORWARDED}


def collector_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` completed with `Collector`'s defaults; unknown or missing ones raise ``TypeError``."""
    params = _collector_parameters()
    for key in options:
        if key not in params:
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}")
    out = {}
    for key, p in params.items():
        if key in options:
            out[key] = options[key]
        elif p.default is inspect.Parameter.empty:
            raise TypeError(f"{name}() missing required keyword-only argument: {key!r}")
        else:
            out[key] = p.default
    return out


# Arguments a multi-worker collector also accepts as one value per worker.
_PER_WORKER = {
    "frames_per_batch": "int | Sequence[int]",
    "create_env_kwargs": "dict[str, Any] | Sequence[dict[str, Any]] | None",
    "env_device": "Any | Sequence[Any]",
    "policy_device": "Any | Sequence[Any]",
    "device": "Any | Sequence[Any]",
    "storing_device": "Any | Sequence[Any]",  # TorchRL's list form; the entries must be one device
}


def multi_signature(init: Any) -> inspect.Signature:
    """``init``'s own parameters with ``**options`` replaced by `Collector`'s keyword arguments."""
    own = [p for p in inspect.signature(init).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in own}
    extra = [
        p.replace(annotation=_PER_WORKER.get(k, p.annotation))
        for k, p in _collector_parameters().items()
        if k not in taken
    ]
    positional = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    # Required keyword-only parameters first (frames_per_batch), then the optional ones.
    ordered = sorted(keyword + extra, key=lambda p: p.default is not inspect.Parameter.empty)
    return inspect.signature(init).replace(parameters=positional + ordered)


def _per_worker(name: str, value: Any, n: int) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            # TorchRL's sentence first (its users match on it), then the value and the fix.
            raise ValueError(
                f"If `{name}` is provided as a sequence, it should contain exactly one value per worker: got "
                f"{len(value)} values for {n} workers; give one per worker"
            )
        return list(value)
    return [value] * n


def _is_single_collector(value: Any) -> bool:
    """``value`` is a class that means "one in-process collector per worker": aiocollect's or TorchRL's."""
    import sys

    from .._collect._collector import Collector

    if value is Collector:
        return True
    blocking = sys.modules.get("aiocollect.blocking")  # imported if the caller could name its class
    if blocking is not None and value is getattr(blocking, "Collector", None):
        return True
    # TorchRL's own class (checked without importing torchrl; 0.14 has no SyncDataCollector): a
    # script whose import line changed still passes it. Its subclasses' overrides would never run.
    torchrl = sys.modules.get("torchrl.collectors")
    return torchrl is not None and value is getattr(torchrl, "Collector", None)


def check_collector_class(name: str, value: Any) -> None:
    """TorchRL's ``collector_class``: each worker runs one in-process collector, so only that class is taken."""
    if value is None or _is_single_collector(value):
        return
    if isinstance(value, type) and value.__name__ in (
        "MultiSyncCollector", "MultiAsyncCollector", "MultiSyncDataCollector", "MultiaSyncDataCollector",
    ):  # fmt: skip
        raise ValueError(
            f"collector_class={value.__name__} would start worker processes inside each worker, which {name} does "
            "not do: give num_workers the total instead, or use DistributedCollector(collector_class="
            f"{value.__name__}) for a multi-process collector per node"
        )
    why = (
        f": {name}'s workers run aiocollect's own rollout, so its overrides would never run; move what it adds to "
        "postproc= or post_collect_hook=, or drop collector_class"
        if isinstance(value, type)
        else "; drop it, or pass Collector"
    )
    raise TypeError(
        f"collector_class must be None or Collector (aiocollect's or TorchRL's, the default), got {value!r}{why}"
    )


def resolve_multi_config(
    *,
    sync: bool,
    create_env_fn: Any,
    num_workers: int | None,
    policy: Any,
    policy_factory: Any,
    frames_per_batch: Any,
    cat_results: Any,
    update_at_each_batch: Any,
    preemptive_threshold: Any,
    num_threads: Any,
    num_sub_threads: Any,
    restart_workers: Any,
    weight_sync_timeout: Any,
    worker_timeout: Any,
    start_method: Any,
    backend: Any,
    device: Any,
    env_device: Any,
    policy_device: Any,
    storing_device: Any,
    create_env_kwargs: Any,
    postproc: Any,
    split_trajs: Any,
    total_frames: Any,
    max_queued_batches: Any,
    weight_sync_schemes: Any = None,
    weight_updater: Any = None,
    weight_recv_schemes: Any = None,
    collector_class: Any = None,
    init_fn: Any = None,
    **common: Any,
) -> MultiConfig:
    """Validate every argument of a multi-process collector (``common`` goes to every worker)."""
    name = "MultiSyncCollector" if sync else "MultiAsyncCollector"
    check_collector_class(name, collector_class)
    if init_fn is not None and not callable(init_fn):
        raise TypeError(
            f"init_fn must be a callable taking no arguments (called first in each worker process) or None, "
            f"got {init_fn!r}"
        )
    if isinstance(create_env_fn, (list, tuple)):
        check_int("num_workers", num_workers, allow_none=True)
        fns = list(create_env_fn)
        if num_workers is not None and num_workers != len(fns):
            raise ValueError(
                f"num_workers={num_workers!r} but create_env_fn lists {len(fns)} factories; drop num_workers"
            )
    else:
        workers = check_int("num_workers", num_workers, rule="a positive int when create_env_fn is a single factory")
        fns = [create_env_fn] * workers
    n = len(fns)
    if n == 0:
        raise ValueError("create_env_fn must list at least one env factory, got an empty list")
    if isinstance(frames_per_batch, (list, tuple)):
        fpbs = _per_worker("frames_per_batch", frames_per_batch, n)
        if not sync:
            # TorchRL's rule: an async collector's batch is the list's sum, whichever worker delivers it.
            fpbs = [sum(fpbs)] * n
        total_fpb = sum(fpbs) if sync else fpbs[0]
    else:
        total_fpb = frames_per_batch
        valid = isinstance(frames_per_batch, int) and not isinstance(frames_per_batch, bool) and frames_per_batch > 0
        # An invalid value is passed through unchanged so validate_config reports it.
        fpbs = [math.ceil(frames_per_batch / n) if valid and sync else frames_per_batch] * n
    devices = _per_worker("device", device, n)
    device = devices[0] if all(d == devices[0] for d in devices) else None  # else: each worker its own
    stores = _per_worker("storing_device", storing_device, n)
    if any(s != stores[0] for s in stores):
        raise ValueError(
            f"storing_device must name one device for every worker, got {storing_device!r}; {name} stores every "
            "batch on one device: give one"
        )
    storing_device = stores[0]
    weight_sync = resolve_weight_sync(name, weight_sync_schemes, weight_updater, workers=True)
    check_recv_schemes(name, weight_recv_schemes)
    factories = _per_worker("policy_factory", policy_factory, n)
    for f in factories:
        if f is not None and not callable(f):
            raise TypeError(f"policy_factory must be a zero-argument callable (or one per worker), got {f!r}")
    cfg = validate_config(
        create_env_fn=fns[0], policy=policy, frames_per_batch=total_fpb, total_frames=total_frames, postproc=postproc,
        split_trajs=split_trajs, device=device, env_device=None, policy_device=None, storing_device=storing_device,
        create_env_kwargs=None, max_queued_batches=max_queued_batches, **common,
    )  # fmt: skip
    envd, pold = _per_worker("env_device", env_device, n), _per_worker("policy_device", policy_device, n)
    kwargs = _per_worker("create_env_kwargs", create_env_kwargs, n)
    worker_cfgs = [
        dataclasses.replace(
            validate_config(
                create_env_fn=fns[w], policy=policy, frames_per_batch=fpbs[w], total_frames=-1, postproc=None,
                split_trajs=False, device=devices[w], env_device=envd[w], policy_device=pold[w], storing_device=None,
                create_env_kwargs=kwargs[w], max_queued_batches=0, **common,
            ),
            storing_device=None,
        )
        for w in range(n)
    ]  # fmt: skip
    if sync:
        cat_results = "stack" if cat_results is None else cat_results
        if cat_results != "stack" and (isinstance(cat_results, bool) or not isinstance(cat_results, int)):
            raise ValueError(f"cat_results must be 'stack' or an int dim, got {cat_results!r}")
    elif cat_results is not None and not (isinstance(cat_results, str) and cat_results == "stack"):
        # TorchRL's default, "stack", is accepted (and changes nothing): its users pass it to both.
        raise ValueError(
            f"cat_results is only for MultiSyncCollector ({name} yields each worker's batch whole: None or "
            f"'stack'), got {cat_results!r}; drop cat_results"
        )
    else:
        cat_results = None
    check_bool("update_at_each_batch", update_at_each_batch)
    p = preemptive_threshold
    if p is not None:
        if isinstance(p, bool) or not isinstance(p, (int, float)):
            raise TypeError(f"preemptive_threshold must be a float in [0, 1] or None, got {p!r}")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"preemptive_threshold must be a float in [0, 1] or None, got {p!r}")
        if not sync:
            raise ValueError(
                f"preemptive_threshold only applies to MultiSyncCollector ({name} never waits for stragglers)"
            )
        p = None if p == 1.0 else float(p)  # 1.0 waits for every worker: the same as no threshold
    check_int("num_threads", num_threads, allow_none=True)
    check_int("num_sub_threads", num_sub_threads)
    check_int("restart_workers", restart_workers, minimum=0)
    t = check_seconds("weight_sync_timeout", weight_sync_timeout)
    wt = check_seconds("worker_timeout", worker_timeout, allow_none=True)
    from .._workers import get_transport

    options = get_transport(backend).check_options({"start_method": start_method})
    return MultiConfig(
        cfg=cfg, worker_cfgs=worker_cfgs, factories=factories, cat=cat_results, total_fpb=total_fpb,
        update_at_each_batch=update_at_each_batch, preemptive_threshold=p, num_threads=num_threads,
        num_sub_threads=num_sub_threads, restart_workers=restart_workers, weight_sync_timeout=t, worker_timeout=wt,
        backend=backend, transport_options=options, weight_sync=weight_sync, init_fn=init_fn,
    )  # fmt: skip

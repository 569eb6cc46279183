"""aiocollect: reinforcement-learning experience collection with asyncio at its core.

``…Collector`` names here are asyncio-native; `aiocollect.blocking` holds a blocking twin of
each under the same name, and TorchRL's classic ``…DataCollector`` names are aliases of the
blocking twins.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from ._version import __version__ as __version__

# Public names are imported on first use (PEP 562), so that ``import aiocollect`` stays cheap
# and a worker process that imports only the worker loop never pays for tensordict.
_LAZY: dict[str, tuple[str, str]] = {
    "DataCollectorBase": ("._collect._blocking_base", "DataCollectorBase"),
    "ReplayBuffer": ("._buffer._buffer", "ReplayBuffer"),
    "Collector": ("._collect._collector", "Collector"),
    "AsyncBatchedCollector": ("._collect._central", "AsyncBatchedCollector"),
    "AsyncBatchedEnv": ("._envs._base", "AsyncBatchedEnv"),
    "BatchedEnv": ("._envs._base", "BatchedEnv"),
    "AiocollectError": ("._core._errors", "AiocollectError"),
    "BufferClosedError": ("._core._errors", "BufferClosedError"),
    "BufferEmptyError": ("._core._errors", "BufferEmptyError"),
    "BufferStarvedError": ("._core._errors", "BufferStarvedError"),
    "BufferTimeoutError": ("._core._errors", "BufferTimeoutError"),
    "CollectorClosedError": ("._core._errors", "CollectorClosedError"),
    "EnvOutputError": ("._core._errors", "EnvOutputError"),
    "EnvTimeoutError": ("._core._errors", "EnvTimeoutError"),
    "InferenceError": ("._core._errors", "InferenceError"),
    "InferenceServerClosedError": ("._core._errors", "InferenceServerClosedError"),
    "InferenceServer": ("._serve._server", "InferenceServer"),
    "PolicyOutputError": ("._core._errors", "PolicyOutputError"),
    "WorkerCrashedError": ("._core._errors", "WorkerCrashedError"),
    "WorkerError": ("._core._errors", "WorkerError"),
    "WorkerTimeoutError": ("._core._errors", "WorkerTimeoutError"),
    "WouldBlock": ("._core._errors", "WouldBlock"),
    "wrap_gymnasium": ("._envs._gym", "wrap_gymnasium"),
    "AsyncCollector": ("._multi._collectors", "AsyncCollector"),
    "MultiAsyncCollector": ("._multi._collectors", "MultiAsyncCollector"),
    "MultiSyncCollector": ("._multi._collectors", "MultiSyncCollector"),
    "DistributedCollector": ("._dist._collectors", "DistributedCollector"),
    "DistributedSyncCollector": ("._dist._collectors", "DistributedSyncCollector"),
    "RayCollector": ("._dist._ray_collector", "RayCollector"),
    "RPCCollector": ("._dist._rpc_collector", "RPCCollector"),
    "submitit_delayed_launcher": ("._dist._delayed", "submitit_delayed_launcher"),
    "AsyncEnvPool": ("._envs._pool", "AsyncEnvPool"),
    "PoolCounters": ("._envs._pool", "PoolCounters"),
    "PrioritizedSampler": ("._buffer._prioritized", "PrioritizedSampler"),
    "RandomSampler": ("._buffer._samplers", "RandomSampler"),
    "Sampler": ("._buffer._samplers", "Sampler"),
    "SamplerWithoutReplacement": ("._buffer._samplers", "SamplerWithoutReplacement"),
    "SliceSampler": ("._buffer._slices", "SliceSampler"),
    "ArraySpec": ("._envs._specs", "ArraySpec"),
    "EnvSpec": ("._envs._specs", "EnvSpec"),
    "split_trajectories": ("._collect._split", "split_trajectories"),
    "BufferStats": ("._core._stats", "BufferStats"),
    "CollectorStats": ("._core._stats", "CollectorStats"),
    "MemmapStorage": ("._buffer._storage", "MemmapStorage"),
    "MemoryStorage": ("._buffer._storage", "MemoryStorage"),
    "SharedMemoryStorage": ("._buffer._storage", "SharedMemoryStorage"),
    "Storage": ("._buffer._storage", "Storage"),
    "aSyncDataCollector": (".blocking", "AsyncCollector"),
    "SyncDataCollector": (".blocking", "Collector"),
    "MultiaSyncDataCollector": (".blocking", "MultiAsyncCollector"),
    "MultiSyncDataCollector": (".blocking", "MultiSyncCollector"),
    "DistributedDataCollector": (".blocking", "DistributedCollector"),
    "DistributedSyncDataCollector": (".blocking", "DistributedSyncCollector"),
    "RayDataCollector": (".blocking", "RayCollector"),
    "RPCDataCollector": (".blocking", "RPCCollector"),
}

__all__ = (
    "AiocollectError",
    "ArraySpec",
    "AsyncBatchedCollector",
    "AsyncBatchedEnv",
    "AsyncCollector",
    "AsyncEnvPool",
    "BatchedEnv",
    "BufferClosedError",
    "BufferEmptyError",
    "BufferStarvedError",
    "BufferStats",
    "BufferTimeoutError",
    "Collector",
    "CollectorClosedError",
    "CollectorStats",
    "DataCollectorBase",
    "DistributedCollector",
    "DistributedDataCollector",
    "DistributedSyncCollector",
    "DistributedSyncDataCollector",
    "EnvOutputError",
    "EnvSpec",
    "EnvTimeoutError",
    "InferenceError",
    "InferenceServer",
    "InferenceServerClosedError",
    "MemmapStorage",
    "MemoryStorage",
    "MultiAsyncCollector",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "PolicyOutputError",
    "PoolCounters",
    "PrioritizedSampler",
    "RPCCollector",
    "RPCDataCollector",
    "RandomSampler",
    "RayCollector",
    "RayDataCollector",
    "ReplayBuffer",
    "Sampler",
    "SamplerWithoutReplacement",
    "SharedMemoryStorage",
    "SliceSampler",
    "Storage",
    "SyncDataCollector",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerTimeoutError",
    "WouldBlock",
    "aSyncDataCollector",
    "split_trajectories",
    "submitit_delayed_launcher",
    "wrap_gymnasium",
)


# Collectors whose workers are forked from the fork server by default: looking one up starts it.
_FORKING = frozenset(
    {"AsyncCollector", "MultiAsyncCollector", "MultiSyncCollector"}
    | {"aSyncDataCollector", "MultiaSyncDataCollector", "MultiSyncDataCollector"}
)

# The public submodules, imported on first use too: ``aiocollect.blocking.Collector`` works
# after a bare ``import aiocollect``. Not in __all__, so ``import *`` does not import them.
_SUBMODULES = ("blocking", "testing")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)  # the import binds it in globals()
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    if name in _FORKING:
        # Before the import below (tensordict: about a second): the fork server's own start
        # (torch: as long) then runs beside it instead of after it. See _workers._prestart.
        from ._workers._prestart import prestart_forkserver

        # A head start only, which must never break a lookup: if it fails, the collector
        # starts the server itself and reports why it cannot.
        with contextlib.suppress(Exception):
            prestart_forkserver()
    obj = getattr(importlib.import_module(module, __name__), attr)
    # trio's trick: reprs, tracebacks and pickles name the public path, not the private module.
    mod = getattr(obj, "__module__", None)
    if isinstance(mod, str) and mod.startswith("aiocollect._"):
        try:
            obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
    globals()[name] = obj
    return obj


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})

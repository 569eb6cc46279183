"""aiocollect: reinforcement-learning experience collection with asyncio at its core.

``…Collector`` names here are asyncio-native; `aiocollect.blocking` holds a blocking twin of
each under the same name, and TorchRL's classic ``…DataCollector`` names are aliases of the
blocking twins.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__ as __version__

# Public names are imported on first use (PEP 562), so that ``import aiocollect`` stays cheap
# and a worker process that imports only the worker loop never pays for tensordict.
_LAZY: dict[str, tuple[str, str]] = {
    "DataCollectorBase": ("._blocking_base", "DataCollectorBase"),
    "ReplayBuffer": ("._buffer", "ReplayBuffer"),
    "Collector": ("._collector", "Collector"),
    "AsyncBatchedEnv": ("._envs", "AsyncBatchedEnv"),
    "BatchedEnv": ("._envs", "BatchedEnv"),
    "AiocollectError": ("._errors", "AiocollectError"),
    "BufferClosedError": ("._errors", "BufferClosedError"),
    "BufferEmptyError": ("._errors", "BufferEmptyError"),
    "CollectorClosedError": ("._errors", "CollectorClosedError"),
    "EnvOutputError": ("._errors", "EnvOutputError"),
    "PolicyOutputError": ("._errors", "PolicyOutputError"),
    "WorkerCrashedError": ("._errors", "WorkerCrashedError"),
    "WorkerError": ("._errors", "WorkerError"),
    "WorkerTimeoutError": ("._errors", "WorkerTimeoutError"),
    "WouldBlock": ("._errors", "WouldBlock"),
    "wrap_gymnasium": ("._gym", "wrap_gymnasium"),
    "AsyncCollector": ("._multi", "AsyncCollector"),
    "MultiAsyncCollector": ("._multi", "MultiAsyncCollector"),
    "MultiSyncCollector": ("._multi", "MultiSyncCollector"),
    "AsyncEnvPool": ("._pool", "AsyncEnvPool"),
    "PrioritizedSampler": ("._prioritized", "PrioritizedSampler"),
    "RandomSampler": ("._samplers", "RandomSampler"),
    "Sampler": ("._samplers", "Sampler"),
    "SamplerWithoutReplacement": ("._samplers", "SamplerWithoutReplacement"),
    "SliceSampler": ("._slices", "SliceSampler"),
    "ArraySpec": ("._specs", "ArraySpec"),
    "EnvSpec": ("._specs", "EnvSpec"),
    "split_trajectories": ("._split", "split_trajectories"),
    "BufferStats": ("._stats", "BufferStats"),
    "CollectorStats": ("._stats", "CollectorStats"),
    "MemmapStorage": ("._storage", "MemmapStorage"),
    "MemoryStorage": ("._storage", "MemoryStorage"),
    "SharedMemoryStorage": ("._storage", "SharedMemoryStorage"),
    "Storage": ("._storage", "Storage"),
    "aSyncDataCollector": (".blocking", "AsyncCollector"),
    "SyncDataCollector": (".blocking", "Collector"),
    "MultiaSyncDataCollector": (".blocking", "MultiAsyncCollector"),
    "MultiSyncDataCollector": (".blocking", "MultiSyncCollector"),
}

__all__ = (
    "AiocollectError",
    "ArraySpec",
    "AsyncBatchedEnv",
    "AsyncCollector",
    "AsyncEnvPool",
    "BatchedEnv",
    "BufferClosedError",
    "BufferEmptyError",
    "BufferStats",
    "Collector",
    "CollectorClosedError",
    "CollectorStats",
    "DataCollectorBase",
    "EnvOutputError",
    "EnvSpec",
    "MemmapStorage",
    "MemoryStorage",
    "MultiAsyncCollector",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "PolicyOutputError",
    "PrioritizedSampler",
    "RandomSampler",
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
    "wrap_gymnasium",
)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
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
    return sorted({*globals(), *__all__})

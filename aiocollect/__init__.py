"""aiocollect: reinforcement-learning experience collection with asyncio at its core.

``…Collector`` names here are asyncio-native; `aiocollect.blocking` holds a blocking twin of
each under the same name, and TorchRL's classic ``…DataCollector`` names are aliases of the
blocking twins.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

# Public names are imported on first use (PEP 562), so that ``import aiocollect`` stays cheap
# and a worker process that imports only the worker loop never pays for tensordict. The
# tables live in a leaf module, where the fork server's preload can read them too.
from ._core._names import FORKING as _FORKING
from ._core._names import LAZY as _LAZY
from ._core._public import publish_loaded as _publish_loaded
from ._envs import _gcfreeze as _gcfreeze  # reads the interpreter's own gc freeze count, early
from ._version import __version__ as __version__

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
    "StaleWeightsWarning",
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
    # trio's trick: reprs, tracebacks, pickles and help() name the public path, not the
    # private module: obj's, and those of the public names its import loaded with it.
    _publish_loaded(__name__)
    globals()[name] = obj
    return obj


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})

"""aiocollect: reinforcement-learning experience collection with asyncio at its core.

``…Collector`` names here are asyncio-native; `aiocollect.blocking` holds a blocking twin of
each under the same name, and TorchRL's classic ``…DataCollector`` names are aliases of the
blocking twins.
"""

from __future__ import annotations

from ._blocking_base import DataCollectorBase as DataCollectorBase
from ._buffer import ReplayBuffer as ReplayBuffer
from ._collector import Collector as Collector
from ._envs import AsyncBatchedEnv as AsyncBatchedEnv
from ._envs import BatchedEnv as BatchedEnv
from ._errors import AiocollectError as AiocollectError
from ._errors import BufferClosedError as BufferClosedError
from ._errors import BufferEmptyError as BufferEmptyError
from ._errors import CollectorClosedError as CollectorClosedError
from ._errors import EnvOutputError as EnvOutputError
from ._errors import PolicyOutputError as PolicyOutputError
from ._errors import WorkerCrashedError as WorkerCrashedError
from ._errors import WorkerError as WorkerError
from ._errors import WorkerTimeoutError as WorkerTimeoutError
from ._errors import WouldBlock as WouldBlock
from ._gym import wrap_gymnasium as wrap_gymnasium
from ._multi import AsyncCollector as AsyncCollector
from ._multi import MultiAsyncCollector as MultiAsyncCollector
from ._multi import MultiSyncCollector as MultiSyncCollector
from ._pool import AsyncEnvPool as AsyncEnvPool
from ._prioritized import PrioritizedSampler as PrioritizedSampler
from ._samplers import RandomSampler as RandomSampler
from ._samplers import Sampler as Sampler
from ._samplers import SamplerWithoutReplacement as SamplerWithoutReplacement
from ._slices import SliceSampler as SliceSampler
from ._specs import ArraySpec as ArraySpec
from ._specs import EnvSpec as EnvSpec
from ._split import split_trajectories as split_trajectories
from ._stats import BufferStats as BufferStats
from ._stats import CollectorStats as CollectorStats
from ._storage import MemmapStorage as MemmapStorage
from ._storage import MemoryStorage as MemoryStorage
from ._storage import SharedMemoryStorage as SharedMemoryStorage
from ._storage import Storage as Storage
from ._version import __version__ as __version__
from .blocking import AsyncCollector as aSyncDataCollector
from .blocking import Collector as SyncDataCollector
from .blocking import MultiAsyncCollector as MultiaSyncDataCollector
from .blocking import MultiSyncCollector as MultiSyncDataCollector

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


def _fixup_module_metadata(module_name: str, namespace: dict[str, object]) -> None:
    # trio's trick: reprs, tracebacks and pickles name the public path, not the private module.
    for name in namespace.get("__all__", ()):  # type: ignore[union-attr]
        obj = namespace[name]  # type: ignore[index]
        mod = getattr(obj, "__module__", None)
        if isinstance(mod, str) and mod.startswith("aiocollect._"):
            try:
                obj.__module__ = module_name  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass


_fixup_module_metadata(__name__, globals())

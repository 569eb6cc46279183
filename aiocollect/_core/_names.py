"""Where each public name of ``aiocollect`` lives: the package imports it on first use (PEP 562).

Plain data, in the lowest layer: the package's ``__getattr__`` reads it, and so does the fork
server's preload (`_workers._main_imports`), which must know what a script's ``from aiocollect
import X`` will import in a worker.
"""

from __future__ import annotations

__all__ = ["FORKING", "LAZY"]

#: ``name -> (module relative to aiocollect, attribute)``.
LAZY: dict[str, tuple[str, str]] = {
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
    "StaleWeightsWarning": ("._core._errors", "StaleWeightsWarning"),
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

#: Collectors whose workers are forked from the fork server by default: looking one up starts it.
FORKING = frozenset(
    {"AsyncCollector", "MultiAsyncCollector", "MultiSyncCollector"}
    | {"aSyncDataCollector", "MultiaSyncDataCollector", "MultiSyncDataCollector"}
)

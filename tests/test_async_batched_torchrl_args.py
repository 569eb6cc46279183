"""TorchRL's `AsyncBatchedCollector` arguments: a TorchRL script runs with the import line changed.

Each of TorchRL's own options either does here what it means there (structured configs,
CPU affinity, the initial policy version, the policy's model id, verbose logs) or is refused
before anything is built, saying what to pass instead.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
import torch
from _central_envs import CountEnv, Parity, assert_refused_before_build

from aiocollect import AsyncBatchedCollector

pytestmark = pytest.mark.anyio

CPUS = sorted(os.sched_getaffinity(0))


def count_envs(n: int) -> list[Any]:
    return [partial(CountEnv, i) for i in range(n)]


class AffinityEnv(CountEnv):
    """`CountEnv` whose observation's second entry is the first CPU its process may run on."""

    def _obs(self) -> Any:
        import numpy as np

        return np.array([self.env_id, min(os.sched_getaffinity(0))], np.float32)


class AffinityPolicy(torch.nn.Module):
    """Records the CPUs of the thread it runs on (the collector's)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, ...]] = set()

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.seen.add(tuple(sorted(os.sched_getaffinity(0))))
        return torch.zeros(observation.shape[0], dtype=torch.int64)


async def collect(envs: list[Any], **kwargs: Any) -> tuple[list[Any], Any]:
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(envs, frames_per_batch=20, total_frames=40, **kwargs) as c:
            return [b async for b in c], c


async def test_torchrl_defaults_are_accepted_as_they_are() -> None:
    batches, _ = await collect(count_envs(2), transport="auto", policy_backend="threading", env_exchange="auto",
                               transition_chunk_size="auto", weight_sync_model_id="policy", verbose=False,
                               policy_version=0)  # fmt: skip
    assert len(batches) == 2


async def test_server_config_sets_the_batching() -> None:
    policy = Parity()
    cfg = SimpleNamespace(service_backend="thread", max_batch_size=2, static_batch_size=None, min_batch_size=1,
                          timeout=0.01, collect_stats=True, max_inflight_per_env=None)  # fmt: skip
    _, c = await collect(count_envs(5), policy=policy, server_config=cfg)
    assert (c.max_batch_size, c.min_batch_size, c.server_timeout) == (2, 1, 0.01)
    assert max(policy.sizes[1:]) <= 2, "server_config.max_batch_size bounds the forward passes"


async def test_torchrls_own_config_classes_are_read() -> None:
    isv = pytest.importorskip("torchrl.modules.inference_server")
    server = isv.InferenceServerConfig(max_batch_size=3, min_batch_size=2, timeout=0.05)
    devices = isv.InferenceDeviceConfig(policy_device="cpu", storing_device="cpu")
    batches, c = await collect(count_envs(4), policy=Parity(), server_config=server, device_config=devices)
    assert (c.max_batch_size, c.min_batch_size, c.server_timeout) == (3, 2, 0.05)
    assert all(b.device is None or b.device.type == "cpu" for b in batches)


async def test_policy_version_is_where_versions_start() -> None:
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(count_envs(2), policy=Parity(), frames_per_batch=20, total_frames=60,
                                         policy_version=7, weight_sync_model_id="actor") as c:  # fmt: skip
            versions = []
            async for b in c:
                versions.append(set(b["policy_version"].tolist()))
                if len(versions) == 1:
                    await c.update_policy_weights_(Parity().state_dict(), model_id="actor")
    assert versions[0] == {7} and versions[-1] == {8}, "the model id names the policy"


async def test_verbose_logs_the_start_and_each_batch(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="aiocollect"):
        await collect(count_envs(2), verbose=True)
    messages = [r.getMessage() for r in caplog.records if r.name == "aiocollect"]
    assert any("built" in m for m in messages) and sum("frames collected" in m for m in messages) == 2


@pytest.mark.skipif(len(CPUS) < 2, reason="placing processes on distinct CPUs needs two")
async def test_worker_affinity_places_each_env_worker() -> None:
    masks = [[CPUS[0]], [CPUS[1]]]
    envs = [partial(AffinityEnv, i) for i in range(2)]
    batches, _ = await collect(envs, env_backend="multiprocessing", envs_per_worker=1, worker_affinity=masks)
    for b in batches:
        cpu = b["observation"][:, 1].long()
        env = b["collector", "env_id"]
        assert torch.equal(cpu, torch.tensor([masks[int(e)][0] for e in env])), "each worker on its own CPU"


@pytest.mark.skipif(len(CPUS) < 2, reason="placing a thread on one CPU of several needs two")
async def test_driver_affinity_places_the_collectors_thread() -> None:
    policy = AffinityPolicy()
    await collect(count_envs(2), policy=policy, driver_affinity=[CPUS[-1]])
    assert policy.seen == {(CPUS[-1],)}
    assert sorted(os.sched_getaffinity(0)) == CPUS, "the caller's thread keeps its CPUs"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"transport": object()}, TypeError, "transport must be None, 'auto' or 'driver'"),
        ({"policy_backend": "ray"}, ValueError, "policy_backend must be None or 'threading', got 'ray'"),
        ({"env_exchange": "queue"}, ValueError, "env_exchange must be 'auto' or 'shm', got 'queue'"),
        ({"transition_chunk_size": 64}, ValueError, "transition_chunk_size must be 'auto', got 64"),
        ({"weight_sync_model_id": ""}, TypeError, "weight_sync_model_id must be a non-empty str"),
        ({"verbose": 1}, TypeError, "verbose must be True or False"),
        ({"policy_version": -1}, ValueError, "policy_version"),
        ({"worker_affinity": [[0]]}, ValueError, "applies to env_backend='multiprocessing' only"),
        ({"worker_affinity": [[0]] * 3, "env_backend": "multiprocessing", "envs_per_worker": 1}, ValueError,
         r"gives 3 CPU lists for 2 env workers"),
        ({"driver_affinity": [10_000]}, ValueError, r"names CPUs \[10000\] this process may not run on"),
        ({"driver_affinity": "0"}, TypeError, "driver_affinity must be a non-empty list of CPU numbers"),
        ({"server_config": SimpleNamespace(service_backend="process")}, ValueError,
         "server_config.service_backend must be 'thread'"),
        ({"server_config": SimpleNamespace(static_batch_size=8)}, ValueError, "static_batch_size"),
        ({"server_config": SimpleNamespace(), "max_batch_size": 4}, ValueError, "give one of them"),
        ({"device_config": SimpleNamespace(policy_device="cpu"), "device": "cpu"}, ValueError, "give one of them"),
        ({"device_config": SimpleNamespace(env_device="cuda")}, ValueError, "device_config.env_device must be None"),
    ],
)  # fmt: skip
def test_what_aiocollect_does_otherwise_is_refused_before_anything_is_built(
    kwargs: dict[str, Any], error: type, match: str
) -> None:
    assert_refused_before_build(error, match, **kwargs)

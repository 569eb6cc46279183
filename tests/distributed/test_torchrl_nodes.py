"""TorchRL envs on distributed collection nodes: each node rebuilds the env from its factory.

Loopback only; the autouse fixtures fail a test that leaves a process, thread, fd or
shared-memory segment behind, or that opens a socket outside loopback.
"""

from __future__ import annotations

import anyio
import pytest

pytest.importorskip("torchrl.envs")

from torchrl.envs import EnvCreator, GymEnv, StepCounter, TransformedEnv

from aiocollect import DistributedCollector

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def make_env() -> TransformedEnv:
    return TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(7))


async def test_distributed_nodes_collect_torchrl_envs_with_torchrl_keys() -> None:
    with anyio.fail_after(90):
        async with DistributedCollector(
            [EnvCreator(make_env), make_env], None, frames_per_batch=40, total_frames=80, sync=True,
            launcher="mp", node_hosts=["127.0.0.2", "127.0.0.3"], shutdown_timeout=5.0,
        ) as c:  # fmt: skip
            batches = [b async for b in c]
    assert [b.numel() for b in batches] == [40, 40]
    for b in batches:
        assert {"step_count", ("next", "step_count"), ("next", "truncated")} <= set(b.keys(True, True))
        assert sorted(b["collector", "worker_id"].unique().tolist()) == [0, 1]
        assert bool(b["next", "truncated"].any())  # StepCounter(7) truncates inside each node's 20 steps
        assert bool((b["action"].abs() <= 2).all())  # random actions from the env's action spec

"""TorchRL envs on distributed collection nodes: each node rebuilds the env from its factory.

Loopback only; the autouse fixtures fail a test that leaves a process, thread, fd or
shared-memory segment behind, or that opens a socket outside loopback.
"""

from __future__ import annotations

import anyio
import pytest

pytest.importorskip("torchrl.envs")

from _node_envs import check_torchrl_node_batches, torchrl_pendulum
from torchrl.envs import EnvCreator

from aiocollect import DistributedCollector

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


async def test_distributed_nodes_collect_torchrl_envs_with_torchrl_keys() -> None:
    with anyio.fail_after(90):
        async with DistributedCollector(
            [EnvCreator(torchrl_pendulum), torchrl_pendulum], None, frames_per_batch=40, total_frames=80, sync=True,
            launcher="mp", node_hosts=["127.0.0.2", "127.0.0.3"], shutdown_timeout=5.0,
        ) as c:  # fmt: skip
            batches = [b async for b in c]
    check_torchrl_node_batches(batches)

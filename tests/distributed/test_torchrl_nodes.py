"""TorchRL envs on distributed collection nodes: each node rebuilds the env from its factory.

Loopback only; the autouse fixtures fail a test that leaves a process, thread, fd or
shared-memory segment behind, or that opens a socket outside loopback.
"""

from __future__ import annotations

import gc

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


@pytest.fixture(scope="module", autouse=True)
def torchrl_buffer_process_state() -> None:
    """Make one TorchRL buffer before the first test's leak snapshot.

    Its shared counters live in multiprocessing's process-wide heap (semaphores in /dev/shm)
    and start the resource tracker: both stay for the rest of the process.
    """
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    ReplayBuffer(storage=LazyTensorStorage(1))
    gc.collect()


async def test_a_torchrl_buffer_gets_each_nodes_batch_as_its_own_write() -> None:
    # TorchRL's nodes extend the buffer with their own [T] batches: 20 transitions each, not 2 stacked rows.
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(200))
    with anyio.fail_after(90):
        async with DistributedCollector(
            [torchrl_pendulum, torchrl_pendulum], None, frames_per_batch=40, total_frames=80, sync=True,
            replay_buffer=rb, launcher="mp", node_hosts=["127.0.0.2", "127.0.0.3"], shutdown_timeout=5.0,
        ) as c:  # fmt: skip
            got = [b async for b in c]
    assert got == [None, None]
    assert len(rb) == 80
    stored = rb[:]
    assert stored.batch_size == (80,)
    # Written node by node: node 0's 20 frames, then node 1's, then the next round.
    assert stored["collector", "worker_id"].reshape(4, 20)[:, 0].tolist() == [0, 1, 0, 1]
    # The buffer's semaphores (in /dev/shm) go with it; it lives in reference cycles.
    del rb, stored, c
    gc.collect()

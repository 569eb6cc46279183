"""``launcher="ray"``: DistributedCollector, DistributedSyncCollector and RPCCollector nodes as Ray tasks.

The module's local Ray (loopback, ``num_cpus=2``) runs the nodes; they then join the
trainer's process group or RPC group as nodes of the other launchers do. Each node task has
a Ray worker process of its own, which Ray retires after it.
"""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path

import anyio
import psutil
import pytest
import torch
from _rendezvous import MeetingCountingEnv, met

from aiocollect import DistributedCollector, DistributedSyncCollector, RPCCollector, WorkerCrashedError
from aiocollect.testing import CountingEnv

ray = pytest.importorskip("ray")
from _node_envs import scripted  # noqa: E402
from _ray_procs import local_ray, no_leaks  # noqa: E402, F401  (the module's Ray and its leak check)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

WORKER_ID, TRAJ, VERSION = ("collector", "worker_id"), ("collector", "traj_ids"), ("collector", "policy_version")
NODE = {"num_cpus": 0.5}  # two node tasks fit in the module's num_cpus=2


def counting() -> CountingEnv:
    return CountingEnv(1, episode_length=7)


def kw(**extra: object) -> dict[str, object]:
    return {"launcher": "ray", "remote_configs": NODE, "shutdown_timeout": 5.0, **extra}


@pytest.fixture(scope="module", autouse=True)
def tensorpipe_process_state(request: pytest.FixtureRequest) -> None:
    """Form and close two RPC groups first: TensorPipe keeps process-wide descriptors (see test_rpc.py)."""
    request.getfixturevalue("local_ray")  # the nodes run on it

    async def one() -> None:
        async with RPCCollector([counting] * 2, frames_per_batch=10, total_frames=10, **kw()) as c:
            async for _ in c:
                pass

    for _ in range(2):
        anyio.run(one)


def running_node_tasks(pids: list[int]) -> list[int]:
    """The pids among ``pids`` still running a node task."""
    out = []
    for pid in pids:
        try:
            if "_run_node" in " ".join(psutil.Process(pid).cmdline()):
                out.append(pid)
        except psutil.Error:
            pass
    return out


async def wait_tasks_ended(pids: list[int], within: float) -> None:
    """Wait for the node tasks to end (Ray then retires their processes: one task each)."""

    def wait() -> list[int]:
        deadline = time.monotonic() + within
        while running_node_tasks(pids) and time.monotonic() < deadline:
            time.sleep(0.05)  # no event to wait on: another process's command line
        return running_node_tasks(pids)

    left = await anyio.to_thread.run_sync(wait)
    assert not left, f"node tasks outlived the collector: {left}"


def check_batches(batches: list, sync: bool, nodes: int = 2) -> None:
    if sync:
        assert all(b.shape == torch.Size([nodes, 1, 10]) for b in batches)
        assert all(b[WORKER_ID][i].eq(i).all() for b in batches for i in range(nodes))
    else:
        assert {int(b[WORKER_ID].unique()) for b in batches} == set(range(nodes))
    owners: dict[int, set[int]] = {}
    for b in batches:
        for t, w in zip(b[TRAJ].flatten().tolist(), b[WORKER_ID].flatten().tolist(), strict=True):
            owners.setdefault(t, set()).add(w)
    assert all(len(ws) == 1 for ws in owners.values()), "a trajectory id was used by two nodes"


@pytest.mark.parametrize(
    ("anyio_backend", "cls", "sync"),
    [("asyncio", DistributedCollector, True), ("trio", DistributedCollector, False), ("asyncio", RPCCollector, True)],
    indirect=["anyio_backend"],
)
async def test_nodes_run_as_ray_tasks_and_take_weight_updates(
    cls: type, sync: bool, loopback_only, tmp_path: Path
) -> None:
    # With sync=False whichever node finishes first delivers: a node whose task starts late
    # may deliver nothing in the first batches (one CI run had node 0 deliver all three).
    # So the nodes meet at the first step of their third batch (see _rendezvous), and the
    # fifth batch needs both past it.
    env = counting if sync else partial(MeetingCountingEnv, str(tmp_path), 2, 41)
    policy = scripted(1.0)
    with anyio.fail_after(120):
        async with cls([env] * 2, policy, frames_per_batch=20, total_frames=-1, sync=sync, **kw()) as c:
            batches = [await c.__anext__() for _ in range(3 if sync else 5)]
            pids = [int(p) for p in c._worker_pids()]
            assert len(running_node_tasks(pids)) == 2, "each node runs in a Ray task"
            with torch.no_grad():
                policy.module.weight.fill_(-1.0)
            await c.update_policy_weights_()
            after = await c.__anext__() if sync else None
        await wait_tasks_ended(pids, 10)
    check_batches(batches, sync)
    assert sync or met(tmp_path) == 2
    assert all((b["action"][b["observation"][..., 2] > 0] == 1).all() for b in batches)
    if after is not None:  # with sync=True the next batch is collected after the update
        assert (after[VERSION] == 1).all() and (after["action"][after["observation"][..., 2] > 0] == 0).all()


async def test_distributed_sync_collector_gathers_one_batch_per_ray_node() -> None:
    with anyio.fail_after(120):
        async with DistributedSyncCollector(
            [counting] * 2, scripted(), frames_per_batch=20, total_frames=80, **kw()
        ) as c:
            batches = [b async for b in c]
    assert c.stats().frames == 80 and len(batches) == 4
    assert all(b.shape == torch.Size([2, 1, 10]) and b[WORKER_ID][1].eq(1).all() for b in batches)


async def test_a_killed_ray_node_is_reported_within_seconds() -> None:
    with anyio.fail_after(120), pytest.raises(WorkerCrashedError) as info:
        async with DistributedCollector(
            [counting] * 2, scripted(), frames_per_batch=10, total_frames=-1, sync=False, **kw()
        ) as c:
            await c.__anext__()
            os.kill(int(c._worker_pids()[1]), signal.SIGKILL)
            killed = time.monotonic()
            async for _ in c:
                pass
    assert time.monotonic() - killed < 5.0
    assert info.value.worker_id == 1 and "rank 2" in str(info.value)


async def test_a_killed_ray_node_is_launched_again() -> None:
    with anyio.fail_after(120):
        async with DistributedCollector(
            [counting] * 2, scripted(), frames_per_batch=10, total_frames=100, sync=True, restart_nodes=1, **kw()
        ) as c:
            await c.__anext__()
            old = int(c._worker_pids()[1])
            os.kill(old, signal.SIGKILL)
            rest = [b async for b in c]
            new = int(c._worker_pids()[1])
    assert new != old and c.stats().restarts == 1
    assert sum(b.numel() for b in rest) == 90 and all(b[WORKER_ID][1].eq(1).all() for b in rest)


@pytest.mark.parametrize("cls", [DistributedCollector, RPCCollector])
async def test_break_ends_every_ray_node_task_within_the_deadline(cls: type) -> None:
    with anyio.fail_after(120):
        async with cls([counting] * 2, scripted(), frames_per_batch=10, total_frames=-1, **kw()) as c:
            async for _ in c:
                break
            pids = [int(p) for p in c._worker_pids()]
            start = time.perf_counter()
        closed = time.perf_counter() - start
        await wait_tasks_ended(pids, 5)
    assert closed < 2.0, f"shutdown took {closed:.2f}s"
    assert ray.is_initialized(), "the collector shut down a Ray it did not start"

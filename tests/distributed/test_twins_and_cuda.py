"""The blocking twins of the distributed collectors, and the NCCL path (skipped without GPUs)."""

from __future__ import annotations

from functools import partial

import anyio
import pytest
import torch
from _node_envs import scripted

from aiocollect import DistributedCollector
from aiocollect.blocking import DistributedCollector as BlockingDistributedCollector
from aiocollect.blocking import DistributedSyncCollector as BlockingDistributedSyncCollector
from aiocollect.testing import CountingEnv

pytestmark = pytest.mark.timeout(120)

ENVS = [partial(CountingEnv, 1, episode_length=5), partial(CountingEnv, 1, episode_length=5)]
VERSION = ("collector", "policy_version")


def test_blocking_twin_collects_syncs_weights_and_exits_cleanly() -> None:
    policy = scripted()
    kw = {"launcher": "mp", "node_hosts": ["127.0.0.2", "127.0.0.3"], "shutdown_timeout": 5.0}
    with BlockingDistributedCollector(ENVS, policy, frames_per_batch=10, total_frames=30, sync=True, **kw) as c:
        it = iter(c)
        first = next(it)
        with torch.no_grad():
            policy.module.weight.fill_(2.0)
        c.update_policy_weights_()
        rest = list(it)
        pids = list(c._async._worker_pids())
    assert first.shape == torch.Size([2, 1, 5]) and len(rest) == 2
    assert all((b[VERSION] == 1).all() for b in rest)
    assert len(pids) == 2
    with BlockingDistributedSyncCollector(ENVS, policy, frames_per_batch=10, **kw) as s:
        endless = [b for _, b in zip(range(4), s, strict=False)]  # total_frames=-1: it stops when we stop
    assert [b.shape for b in endless] == [torch.Size([2, 1, 5])] * 4


@pytest.mark.anyio
async def test_blocking_twin_refuses_to_run_inside_an_event_loop() -> None:
    # The twin starts its nodes in the constructor (as TorchRL's does): refused there, nothing started.
    with pytest.raises(RuntimeError, match=r"aiocollect\.DistributedCollector"):
        BlockingDistributedCollector(ENVS, None, frames_per_batch=10, launcher="mp")


@pytest.mark.anyio
@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL pairs need the trainer and a node on distinct GPUs")
async def test_nccl_batches_and_weights_travel_between_gpus() -> None:
    policy = scripted().to("cuda:0")
    with anyio.fail_after(90):
        async with DistributedCollector(
            ENVS[:1], policy, frames_per_batch=10, total_frames=30, sync=True, launcher="mp", backend="nccl",
            device="cuda",
        ) as c:  # fmt: skip
            first = await c.__anext__()
            with torch.no_grad():
                policy.module.weight.fill_(-1.0)
            await c.update_policy_weights_()
            rest = [b async for b in c]
    assert first.device.type == "cuda" and all(b.device.type == "cuda" for b in rest)
    assert all((b[VERSION] == 1).all() for b in rest)
    assert all((b["action"][b["observation"][..., 2] > 0] == 0).all() for b in rest)


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="the refusal of one GPU needs a machine with exactly one")
def test_nccl_on_a_one_gpu_machine_is_refused_before_any_node_starts() -> None:
    # NCCL itself answers two ranks on one GPU with "Duplicate GPU detected" (seen on an H200,
    # tools/device/nccl_same_gpu.py); the collector says so, with the fix, and starts nothing.
    with pytest.raises(ValueError, match=r"needs at least 2 GPUs .* has 1; use backend='gloo'"):
        DistributedCollector(ENVS[:1], scripted().to("cuda"), frames_per_batch=10, launcher="mp", backend="nccl",
                             device="cuda")  # fmt: skip

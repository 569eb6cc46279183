"""A policy with lazy modules (``nn.LazyLinear``) is refused where a copy of it would diverge.

A copy of an uninitialized lazy module initializes on its own at its first forward pass, to
weights the trainer's module never sees (TorchRL users lose their parameters that way in
silence, pytorch/rl#743). Worker collectors and an in-process collector acting with a copy on
another device say so when they are built, before anything starts (an inference server, as it
starts); an in-process collector running the trainer's own module initializes it, as a
training loop would.
"""

from __future__ import annotations

from typing import Any

import anyio
import psutil
import pytest
import torch

from aiocollect import (
    AsyncCollector,
    Collector,
    DistributedCollector,
    InferenceServer,
    MultiAsyncCollector,
    MultiSyncCollector,
    blocking,
)
from aiocollect.testing import CountingEnv

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(120),
    # torch 2.3 warns at the construction of every lazy module (the tests' own).
    pytest.mark.filterwarnings("ignore:Lazy modules are a new feature:UserWarning"),
]

MESSAGE = (
    r"^the policy has uninitialized lazy parameters \(net\.weight, net\.bias\): {} would initialize apart from "
    r"the trainer's module; run one forward pass on an observation \(policy\(obs\)\) before passing it$"
)


class LazyPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.LazyLinear(1)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (self.net(observation.float()).squeeze(-1) > 0).long()


def env() -> CountingEnv:
    return CountingEnv(2, episode_length=4)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.parametrize(
    "build",
    [
        lambda p: MultiSyncCollector([env, env], p, frames_per_batch=8),
        lambda p: MultiAsyncCollector([env, env], p, frames_per_batch=8),
        lambda p: AsyncCollector(env, p, frames_per_batch=8),
        lambda p: DistributedCollector([env, env], p, frames_per_batch=8),
        lambda p: blocking.MultiSyncCollector([env, env], p, frames_per_batch=8),  # starts its workers when built
    ],
    ids=["MultiSync", "MultiAsync", "Async", "Distributed", "blocking.MultiSync"],
)
def test_worker_collectors_refuse_an_uninitialized_lazy_policy_before_starting_anything(build: Any) -> None:
    before = children()
    with pytest.raises(ValueError, match=MESSAGE.format("its workers' copies")):
        build(LazyPolicy())
    assert children() <= before, "a process was started for a collector that was refused"


async def test_once_initialized_the_workers_act_with_the_trainers_weights() -> None:
    policy = LazyPolicy()
    policy(torch.zeros(1, 3))  # the fix the message names
    with torch.no_grad():  # weights no fresh initialization gives: act 1 before the third step
        policy.net.weight.copy_(torch.tensor([[0.0, 0.0, -1.0]]))
        policy.net.bias.fill_(1.5)
    with anyio.fail_after(60):
        async with MultiSyncCollector([env, env], policy, frames_per_batch=8, total_frames=16) as c:
            async for batch in c:
                assert torch.equal(batch["action"], (batch["observation"][..., 2] < 1.5).long())


async def test_an_in_process_collector_initializes_the_trainers_own_module() -> None:
    policy = LazyPolicy()
    with anyio.fail_after(60):
        async with Collector(env, policy, frames_per_batch=8, total_frames=8) as c:
            async for batch in c:
                assert torch.equal(batch["action"], policy(batch["observation"]))
    assert policy.net.weight.shape == (1, 3) and not torch.nn.parameter.is_lazy(policy.net.weight)


def test_an_in_process_collector_refuses_to_copy_it_onto_another_device() -> None:
    # "meta" stands for any device the module is not on (tests/test_cuda.py runs CUDA's case):
    # the collector would act with a copy there.
    with pytest.raises(ValueError, match=MESSAGE.format("its copy on policy_device=meta")):
        Collector(env, LazyPolicy(), frames_per_batch=8, policy_device="meta")


async def test_an_inference_server_refuses_to_copy_it_onto_another_device() -> None:
    with anyio.fail_after(30), pytest.raises(ValueError, match=MESSAGE.format("its copy on device=meta")):
        async with InferenceServer(LazyPolicy(), device="meta"):
            pass

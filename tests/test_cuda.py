"""CUDA end to end: devices, batches from worker processes, weight updates, CUDA replay buffers.

Every test here compares what a collector gives on the device with what it gives on the host
(same envs, same deterministic policy), so a wrong copy, a lost frame or a stale weight shows.
They need a GPU and skip without one. ``AIOCOLLECT_TEST_DEVICE=cpu`` runs them on the host
instead (``.ci/run`` does), so they keep running where no GPU is: only the checks that are
about CUDA itself (pinned memory, ``torch.cuda.memory_allocated``) are then left out.
"""

from __future__ import annotations

import gc
import os
from functools import partial
from typing import Any

import anyio
import pytest
import torch
from tensordict.nn import TensorDictModule

from aiocollect import (
    AsyncCollector,
    Collector,
    MemoryStorage,
    MultiAsyncCollector,
    MultiSyncCollector,
    ReplayBuffer,
    SliceSampler,
    StaleWeightsWarning,
)
from aiocollect.testing import CountingEnv, ScriptedPolicy

DEVICE = torch.device(os.environ.get("AIOCOLLECT_TEST_DEVICE", "cuda"))
ON_GPU = DEVICE.type == "cuda"

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.anyio,
    pytest.mark.skipif(ON_GPU and not torch.cuda.is_available(), reason="needs a CUDA device"),
]

VERSION, TRAJ = ("collector", "policy_version"), ("collector", "traj_ids")
ENV = partial(CountingEnv, 3, episode_length=[3, 4, 5])


def policy(weight: float = 1.0, device: Any = DEVICE) -> TensorDictModule:
    return TensorDictModule(ScriptedPolicy(weight), ["observation"], ["action"]).to(device)


def on(t: Any) -> torch.device:
    return t.device if t.device is not None else torch.device("cpu")


def same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def host(batch: Any) -> Any:
    return batch.to("cpu").exclude(("collector", "worker_id"))


async def collect(cls: type, frames: int, **kwargs: Any) -> list[Any]:
    with anyio.fail_after(120):
        async with cls(ENV, frames_per_batch=12, total_frames=frames, **kwargs) as c:
            return [b async for b in c]


# --------------------------------------------------------------------------------------------
# In process: TorchRL's device arguments
# --------------------------------------------------------------------------------------------

CASES = [
    ({"policy_device": DEVICE}, "cpu"),
    ({"policy_device": DEVICE, "storing_device": DEVICE}, "dev"),
    ({"device": DEVICE, "env_device": "cpu"}, "dev"),
    ({"storing_device": DEVICE}, "dev"),
]


@pytest.mark.parametrize(("kwargs", "where"), CASES, ids=["policy", "policy+storing", "device+env_cpu", "storing"])
async def test_collector_puts_batches_where_asked_with_the_hosts_data(kwargs: dict[str, Any], where: str) -> None:
    pol_device = kwargs.get("policy_device", kwargs.get("device", "cpu"))
    reference = await collect(Collector, 48, policy=policy(device="cpu"))
    batches = await collect(Collector, 48, policy=policy(device=pol_device), **kwargs)
    want = DEVICE if where == "dev" else torch.device("cpu")
    assert len(batches) == len(reference) == 4
    for got, ref in zip(batches, reference, strict=True):
        assert all(same_device(on(v), want) for v in got.values(include_nested=True, leaves_only=True))
        assert (host(got) == host(ref)).all(), "the same frames as on the host"


@pytest.mark.skipif(not ON_GPU, reason="a host policy is copied only onto another device")
async def test_a_host_policy_trained_under_its_device_copy_without_an_update_is_reported() -> None:
    # The collector acts with its copy on policy_device; the trainer's steps change the host module.
    trained = policy(device="cpu")
    with anyio.fail_after(120), pytest.warns(StaleWeightsWarning, match=r"^Collector collected 2 batch"):
        async with Collector(ENV, trained, frames_per_batch=12, total_frames=36, policy_device=DEVICE) as c:
            async for _ in c:
                with torch.no_grad():
                    trained.module.weight.add_(1.0)


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector, AsyncCollector])
async def test_worker_processes_deliver_device_batches_with_the_hosts_frames(cls: type) -> None:
    extra = {} if cls is AsyncCollector else {"num_workers": 2}
    batches = await collect(cls, 48, policy=policy(), policy_device=DEVICE, storing_device=DEVICE, **extra)
    assert sum(b.numel() for b in batches) == 48
    for b in batches:
        assert same_device(on(b), DEVICE)
        assert same_device(b["observation"].device, DEVICE)
        obs, action = b["observation"].cpu(), b["action"].cpu()
        assert torch.equal(action, (obs.sum(-1) > 0).long()), "each frame holds the policy's own action"
        assert torch.equal(b["next", "observation"][..., 2].cpu(), obs[..., 2] + 1), "one step on"


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector, MultiAsyncCollector, AsyncCollector])
async def test_weights_of_a_device_policy_reach_every_worker(cls: type) -> None:
    trainer_policy = policy(1.0)
    workers = 1 if cls in (Collector, AsyncCollector) else 2
    extra = {} if workers == 1 else {"num_workers": workers}
    updated, new_frames, new_workers = False, 0, set()
    with anyio.fail_after(120):
        async with cls(ENV, trainer_policy, frames_per_batch=12, total_frames=-1, policy_device=DEVICE,
                       storing_device=DEVICE, **extra) as c:  # fmt: skip
            async for b in c:
                if not updated:
                    with torch.no_grad():
                        trainer_policy.module.weight.fill_(-1.0)  # every action becomes 0
                    await c.update_policy_weights_()
                    updated = True
                    continue
                new = b[VERSION].cpu() == 1
                action = b["action"].cpu()
                assert torch.equal(action[new], torch.zeros_like(action[new])), "the new weights act"
                new_frames += int(new.sum())
                new_workers |= set(b["collector", "worker_id"].cpu()[new].tolist())
                if new_frames >= 48 and len(new_workers) == workers:
                    break
    assert new_frames >= 48 and len(new_workers) == workers, "frames with the new weights, from every worker"


async def test_worker_batches_on_the_device_leave_no_device_memory_behind() -> None:
    # Earlier tests' garbage first: freed during this test, it would make the end lower than the start.
    gc.collect()
    if ON_GPU:
        torch.cuda.synchronize()
    start = torch.cuda.memory_allocated() if ON_GPU else 0
    batches = await collect(MultiSyncCollector, 96, policy=policy(device="cpu"), storing_device=DEVICE, num_workers=2)
    assert all(same_device(on(b), DEVICE) for b in batches)
    del batches
    gc.collect()
    if ON_GPU:
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == start, "every batch's device memory is freed with it"


# --------------------------------------------------------------------------------------------
# Central inference: the policy on the device, envs on the host
# --------------------------------------------------------------------------------------------


def count_envs(n: int) -> list[Any]:
    from _central_envs import CountEnv

    return [partial(CountEnv, i) for i in range(n)]


def parity_frames_ok(b: Any) -> bool:
    obs = b["observation"]
    return bool((b["action"] == obs[:, 1].long() % 2).all()) and bool(
        (b["next", "observation"][:, 1] == obs[:, 1] + 1).all()
    )


@pytest.mark.parametrize("envs_per_worker", [None, 2])
async def test_central_inference_on_the_device_serves_some_envs_at_a_time(envs_per_worker: int | None) -> None:
    from _central_envs import Parity

    from aiocollect import AsyncBatchedCollector

    with anyio.fail_after(120):
        async with AsyncBatchedCollector(count_envs(6), policy=Parity().to(DEVICE), device=DEVICE, frames_per_batch=60,
                                         total_frames=180, max_batch_size=4,
                                         envs_per_worker=envs_per_worker) as c:  # fmt: skip
            batches = [b async for b in c]
            if ON_GPU:
                assert all(t.is_pinned() for t in c._rollout.cur.values())  # type: ignore[union-attr]
    assert len(batches) == 3 and all(parity_frames_ok(b) for b in batches)


async def test_a_coroutine_policy_may_answer_on_the_device() -> None:
    from aiocollect import AsyncBatchedCollector

    async def policy(td: Any) -> torch.Tensor:
        return (td["observation"][1].long() % 2).to(DEVICE)  # a model on the GPU answers there

    with anyio.fail_after(120):
        async with AsyncBatchedCollector(count_envs(3), policy=policy, frames_per_batch=30, total_frames=60) as c:
            batches = [b async for b in c]
    assert len(batches) == 2 and all(parity_frames_ok(b) for b in batches)


# --------------------------------------------------------------------------------------------
# Replay buffers on the device
# --------------------------------------------------------------------------------------------


async def test_a_device_replay_buffer_fed_by_background_collection() -> None:
    rb = ReplayBuffer(10_000, batch_size=24, storage=MemoryStorage(device=DEVICE))
    with anyio.fail_after(120):
        async with Collector(ENV, policy(), frames_per_batch=12, total_frames=240, policy_device=DEVICE,
                             replay_buffer=rb) as c:  # fmt: skip
            c.start()
            await c.wait_finished()
    assert len(rb) == 240
    assert all(same_device(t.device, DEVICE) for t in rb.storage.tensors.values())
    sample = await rb.sample()
    assert same_device(on(sample), DEVICE) and sample.shape == (24,)
    obs = sample["observation"]
    assert torch.equal(sample["action"], (obs.sum(-1) > 0).long()), "frames arrived whole"
    assert torch.equal(sample["next", "observation"][..., 2], obs[..., 2] + 1)
    for key, copy in rb.storage.host.items():  # what samplers read is the stored columns' own
        assert copy.device.type == "cpu" and torch.equal(copy, rb.storage.tensors[key].cpu())


async def test_worker_processes_fill_a_device_buffer_through_the_parent() -> None:
    rb = ReplayBuffer(1000, batch_size=24, storage=MemoryStorage(device=DEVICE))
    with anyio.fail_after(120):
        async with MultiSyncCollector(ENV, policy(), num_workers=2, frames_per_batch=24, total_frames=96,
                                      policy_device=DEVICE, replay_buffer=rb) as c:  # fmt: skip
            assert [b async for b in c] == [None] * 4
    assert isinstance(rb.storage, MemoryStorage) and rb.storage.device == DEVICE, "kept, not made shared"
    assert len(rb) == 96
    sample = await rb.sample()
    assert same_device(on(sample), DEVICE)
    assert torch.equal(sample["action"], (sample["observation"].sum(-1) > 0).long())


async def test_slices_from_a_device_buffer_follow_trajectories() -> None:
    rb = ReplayBuffer(600, batch_size=12, storage=MemoryStorage(device=DEVICE), sampler=SliceSampler(slice_len=3))
    with anyio.fail_after(120):
        async with Collector(ENV, policy(), frames_per_batch=12, total_frames=120, policy_device=DEVICE,
                             replay_buffer=rb) as c:  # fmt: skip
            async for _ in c:
                pass
    for _ in range(5):
        s = (await rb.sample()).reshape(4, 3)
        assert same_device(on(s), DEVICE)
        traj = s[TRAJ].cpu()
        assert bool((traj == traj[:, :1]).all()), "a slice never crosses trajectories"
        steps = s["observation"][..., 2].cpu()
        assert bool((steps[:, 1:] == steps[:, :-1] + 1).all()), "a slice holds consecutive steps"


async def test_a_device_buffer_drops_stale_frames_and_round_trips_its_state() -> None:
    rb = ReplayBuffer(100, batch_size=10, storage=MemoryStorage(device=DEVICE), max_policy_lag=0)
    with anyio.fail_after(120):
        async with Collector(ENV, policy(), frames_per_batch=12, total_frames=48, policy_device=DEVICE,
                             replay_buffer=rb) as c:  # fmt: skip
            async for _ in c:
                pass
            assert len(rb) == 48
            kept = (await rb.sample()).to("cpu").exclude("index")
            await c.update_policy_weights_()  # the buffer's version moves on: version-0 frames are too old now
    assert (len(rb), rb.stats().stale_dropped) == (0, 48), "read from the versions' host copy"
    kept[VERSION] = torch.ones_like(kept[VERSION])
    await rb.extend(kept)  # a host batch lands on the device too
    assert len(rb) == 10 and same_device(on(await rb.sample()), DEVICE)
    state = rb.state_dict()
    other = ReplayBuffer(100, batch_size=10, storage=MemoryStorage(device=DEVICE))
    other.load_state_dict(state)
    assert len(other) == len(rb)
    for key, copy in other.storage.host.items():
        assert torch.equal(copy, other.storage.tensors[key].cpu())


def test_a_device_storage_says_where_it_lives() -> None:
    assert MemoryStorage(device=DEVICE).device == DEVICE
    assert MemoryStorage().device is None


@pytest.mark.skipif(not ON_GPU, reason="a host policy is copied only onto another device")
def test_an_uninitialized_lazy_host_policy_is_not_copied_onto_the_device() -> None:
    # Its device copy would initialize apart from the trainer's module (tests/test_lazy_policies.py).
    lazy = torch.nn.Sequential(torch.nn.LazyLinear(1))
    pattern = r"^the policy has uninitialized lazy parameters \(0\.weight, 0\.bias\): its copy on policy_device="
    with pytest.raises(ValueError, match=pattern):
        Collector(ENV, lazy, frames_per_batch=12, policy_device=DEVICE)

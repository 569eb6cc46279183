"""TorchRL's collector queries: the trajectory-mode attributes, get_model, frames_per_batch_worker.

Each is answered in this process without starting the collector (the async classes build
nothing until they start), except where a blocking twin is checked to forward it.
"""

from __future__ import annotations

import pytest
import torch

from aiocollect import AsyncCollector, Collector, MultiAsyncCollector, MultiSyncCollector, ReplayBuffer
from aiocollect.blocking import Collector as BlockingCollector
from aiocollect.blocking import MultiSyncCollector as BlockingMultiSync
from aiocollect.testing import CountingEnv


def counting() -> CountingEnv:
    return CountingEnv(2, episode_length=3)


def mlp() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


# -- trajectory-mode attributes ------------------------------------------------------------------
@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector, MultiAsyncCollector])
def test_trajectory_attributes_are_what_was_asked(cls: type) -> None:
    workers = {} if cls is Collector else {"num_workers": 2}
    plain = cls(counting, frames_per_batch=8, **workers)
    assert (plain.trajs_per_batch, plain.traj_format, plain.trajs_per_write) == (None, "padded", None)
    padded = cls(counting, frames_per_batch=8, trajs_per_batch=3, **workers)
    assert (padded.trajs_per_batch, padded.traj_format, padded.trajs_per_write) == (3, "padded", None)
    rb = ReplayBuffer(100)
    flat = cls(counting, frames_per_batch=8, trajs_per_batch=4, traj_format="cat", trajs_per_write=2,
               replay_buffer=rb, **workers)  # fmt: skip
    assert (flat.trajs_per_batch, flat.traj_format, flat.trajs_per_write) == (4, "cat", 2)


def test_blocking_twin_forwards_the_trajectory_attributes() -> None:
    with BlockingCollector(counting, frames_per_batch=8, total_frames=-1, trajs_per_batch=2, traj_format="cat") as c:
        assert (c.trajs_per_batch, c.traj_format, c.trajs_per_write) == (2, "cat", None)
        batch = next(iter(c))
    assert batch["collector", "traj_ids"].unique().numel() == 2  # the attributes describe what it yields


# -- get_model -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_get_model_gives_the_policy_or_the_object_at_a_path(cls: type) -> None:
    net = mlp()
    workers = {} if cls is Collector else {"num_workers": 2}
    c = cls(counting, net, frames_per_batch=8, **workers)
    assert c.get_model("policy") is c.policy
    assert c.get_model("policy[0]") is net[0]
    with pytest.raises(AttributeError, match="nope"):
        c.get_model("policy.nope")


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_get_model_without_a_policy_here_says_so(cls: type) -> None:
    workers = {} if cls is Collector else {"num_workers": 2}
    c = cls(counting, frames_per_batch=8, **workers)
    with pytest.raises(ValueError, match=rf"^No policy found for model_id 'policy': {cls.__name__} holds no policy"):
        c.get_model("policy")


def test_get_model_with_per_worker_policy_factories_says_the_workers_build_theirs() -> None:
    c = MultiSyncCollector(counting, num_workers=2, frames_per_batch=8, policy_factory=mlp)
    with pytest.raises(ValueError, match="a policy_factory its workers call"):
        c.get_model("policy")


def test_blocking_twin_get_model() -> None:
    net = mlp()
    with BlockingCollector(counting, net, frames_per_batch=8, total_frames=8) as c:
        assert c.get_model("policy[2]") is net[2]


# -- frames_per_batch_worker ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "fpb", "even", "each"),
    [
        (MultiSyncCollector, 15, 8, [8, 8]),  # ceil(15 / 2): TorchRL's split
        (MultiSyncCollector, [4, 12], 8, [4, 12]),  # without an index, the even split of the sum
        (MultiAsyncCollector, 10, 10, [10, 10]),  # every worker is asked for a whole batch
        (MultiAsyncCollector, [4, 12], 16, [16, 16]),  # an async batch is the list's sum
    ],
)
def test_frames_per_batch_worker_is_torchrls_split(cls: type, fpb: object, even: int, each: list[int]) -> None:
    c = cls(counting, num_workers=2, frames_per_batch=fpb)
    assert c.frames_per_batch_worker() == even
    assert [c.frames_per_batch_worker(worker_idx=w) for w in range(2)] == each


def test_async_collector_asks_its_worker_for_whole_batches() -> None:
    c = AsyncCollector(counting, frames_per_batch=10)
    assert c.frames_per_batch_worker() == c.frames_per_batch_worker(worker_idx=0) == 10


@pytest.mark.parametrize("bad", [2, -1, True, "0", 0.0])
def test_frames_per_batch_worker_refuses_what_is_not_a_workers_index(bad: object) -> None:
    c = MultiSyncCollector(counting, num_workers=2, frames_per_batch=8)
    with pytest.raises(
        ValueError, match=rf"^worker_idx must be an int from 0 to 1 \(the workers' indices\), got {bad!r}$"
    ):
        c.frames_per_batch_worker(worker_idx=bad)  # type: ignore[arg-type]


def test_frames_per_batch_worker_is_only_for_worker_collectors() -> None:
    assert not hasattr(Collector(counting, frames_per_batch=8), "frames_per_batch_worker")  # as in TorchRL
    assert not hasattr(BlockingCollector, "frames_per_batch_worker")


@pytest.mark.timeout(120)
def test_blocking_multi_twin_frames_per_batch_worker() -> None:
    with BlockingMultiSync(counting, num_workers=2, frames_per_batch=[4, 12], total_frames=16, backend="inline") as c:
        assert [c.frames_per_batch_worker(worker_idx=w) for w in range(2)] == [4, 12]
        (batch,) = list(c)
    assert [part.numel() for part in batch.tensordicts] == [4, 12]  # what each worker was asked for

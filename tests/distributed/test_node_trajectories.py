"""Complete-trajectory mode (``trajs_per_batch``) on collection nodes.

The trainer assembles whole episodes from the nodes' batches; `check_whole_episodes_on_nodes`
(in ``_node_envs``, which the RPC and Ray modules run too) says what is checked. Here: the
torch.distributed collectors, TorchRL's ``collector_kwargs`` form with a replay buffer, the
argument checks, and the blocking twin.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import torch
from _node_envs import LENGTH, check_each_nodes_episodes_in_order, check_whole_episodes_on_nodes, episodes_of
from tensordict import TensorDict

from aiocollect import (
    DistributedCollector,
    DistributedSyncCollector,
    ReplayBuffer,
    RPCCollector,
    SharedMemoryStorage,
    blocking,
)
from aiocollect.testing import CountingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

WORKER_ID = ("collector", "worker_id")


def counting() -> CountingEnv:
    return CountingEnv(1, episode_length=LENGTH)


def kw(**extra: Any) -> dict[str, Any]:
    return {"launcher": "mp", "shutdown_timeout": 5.0, **extra}


CASES = [
    pytest.param(DistributedCollector, {"sync": False}, id="first-node"),
    pytest.param(DistributedCollector, {"sync": True}, id="gathered"),
    pytest.param(DistributedSyncCollector, {}, id="free-running"),
]


@pytest.mark.parametrize(("cls", "extra"), CASES)
async def test_padded_batches_hold_whole_episodes_of_one_node_each(cls: type, extra: dict[str, Any]) -> None:
    await check_whole_episodes_on_nodes(cls, **kw(**extra))  # RPC's and Ray's in their own modules


async def test_torchrls_collector_kwargs_form_writes_whole_episodes_to_the_buffer() -> None:
    # TorchRL's RPC and Ray collectors pass trajs_per_batch on in each node's collector_kwargs.
    rb = ReplayBuffer(capacity=1000)
    with anyio.fail_after(90):
        async with DistributedCollector(
            [counting] * 2, None, frames_per_batch=10, total_frames=120, replay_buffer=rb,
            collector_kwargs={"trajs_per_batch": 2, "traj_format": "cat", "trajs_per_write": 2}, **kw(),
        ) as c:  # fmt: skip
            assert c.trajs_per_batch == 2 and c.traj_format == "cat" and c.trajs_per_write == 2
            got = [b async for b in c]
    assert got and set(got) == {None}
    frames = rb.write_count
    assert frames % (2 * LENGTH) == 0 and frames > 0  # two whole episodes per extend
    written = TensorDict(batch_size=[frames])
    for key, tensor in rb.storage.tensors.items():
        written.set(key, tensor[:frames])
    check_each_nodes_episodes_in_order(episodes_of(written))


def build(cls: type, **extra: Any) -> Any:
    return cls([counting] * 2, None, frames_per_batch=10, **kw(**extra))


@pytest.mark.parametrize("cls", [DistributedCollector, DistributedSyncCollector, RPCCollector])
def test_trajectory_arguments_are_checked_before_any_node_starts(cls: type) -> None:
    with pytest.raises(ValueError, match=r"with different values.*pass trajs_per_batch= to"):
        build(cls, collector_kwargs=[{"trajs_per_batch": 2}, {"trajs_per_batch": 3}])
    with pytest.raises(ValueError, match="for some nodes"):
        build(cls, collector_kwargs=[{"traj_format": "cat"}, {}], trajs_per_batch=2)
    with pytest.raises(ValueError, match="trajs_per_batch=2 contradicts collector_kwargs' trajs_per_batch=3"):
        build(cls, trajs_per_batch=2, collector_kwargs={"trajs_per_batch": 3})
    with pytest.raises(ValueError, match="traj_format and trajs_per_write need trajs_per_batch"):
        build(cls, traj_format="cat")
    with pytest.raises(ValueError, match="traj_format must be 'padded' or 'cat'"):
        build(cls, trajs_per_batch=2, traj_format="flat")
    with pytest.raises(ValueError, match="trajs_per_batch must be a positive int or None, got 0"):
        build(cls, trajs_per_batch=0)
    with pytest.raises(ValueError, match="split_trajs=True and trajs_per_batch both cut batches"):
        build(cls, trajs_per_batch=2, split_trajs=True)
    with pytest.raises(ValueError, match="give the replay buffer ndim=1 storage"):
        build(cls, trajs_per_batch=2, replay_buffer=ReplayBuffer(100, storage=SharedMemoryStorage(ndim=2)))
    # Given the same way on every node, collector_kwargs' value is the collector's.
    same = build(cls, collector_kwargs=[{"trajs_per_batch": 4}, {"trajs_per_batch": 4}], trajs_per_batch=4)
    assert same.trajs_per_batch == 4 and all("trajs_per_batch" not in d for d in same._dc.node_kwargs)


def test_the_blocking_twin_yields_whole_episodes() -> None:
    c = blocking.DistributedCollector(
        [counting] * 2, None, frames_per_batch=10, total_frames=60, trajs_per_batch=2, traj_format="cat",
        **kw(sync=True),
    )  # fmt: skip
    try:
        batches = list(c)
    finally:
        c.shutdown()
    assert batches and all(b.shape == (2 * LENGTH,) for b in batches)
    found = [ep for b in batches for ep in episodes_of(b)]
    assert {node for node, _ in found} <= {0, 1}
    assert torch.equal(batches[0]["next", "done"].flatten().nonzero().flatten(), torch.tensor([6, 13]))

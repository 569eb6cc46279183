"""map_fn, get_distant_attr, cascade_execute, getattr_* and TorchRL's attributes, in process and in workers."""

from __future__ import annotations

import math

import anyio
import pytest
import torch

from aiocollect import Collector, DistributedCollector, MultiAsyncCollector, MultiSyncCollector, ReplayBuffer
from aiocollect._core._remote import call_lists, resolve_path
from aiocollect.blocking import Collector as BlockingCollector
from aiocollect.blocking import MultiAsyncCollector as BlockingMultiAsync
from aiocollect.testing import CountingEnv

pytestmark = pytest.mark.anyio


def counting() -> CountingEnv:
    return CountingEnv(2, episode_length=3)


# -- attribute paths and argument lists ----------------------------------------------------------
def test_resolve_path_reads_attributes_and_subscripts() -> None:
    class Node:
        def __init__(self, child: object = None) -> None:
            self.items = {"a": [10, {"b": 20}]}
            self.child = child

    root = Node(Node())
    assert resolve_path(root, "child.items['a'][1][\"b\"]") == 20
    assert resolve_path(root, "items[a][0]") == 10  # a bare word is a string key, as in TorchRL
    with pytest.raises(AttributeError):
        resolve_path(root, "child.nope")
    with pytest.raises(ValueError, match="not a name followed by"):
        resolve_path(root, "child..items")
    with pytest.raises(TypeError, match="non-empty str"):
        resolve_path(root, "")


def test_call_lists_follow_torchrl_rules() -> None:
    assert call_lists(None, None) == [((), {})]
    assert call_lists([(1,), (2,)], None) == [((1,), {}), ((2,), {})]
    assert call_lists(None, None, workers=2) == [((), {}), ((), {})]
    with pytest.raises(ValueError, match=r"^list_of_args and list_of_kwargs must have the same length"):
        call_lists([(1,)], [{}, {}])
    with pytest.raises(ValueError, match=r"^Expected 2 argument entries \(one per worker\), got 1"):
        call_lists([(1,)], None, workers=2)
    with pytest.raises(TypeError, match="list_of_args must be a list"):
        call_lists("abc", None)


# -- in-process ----------------------------------------------------------------------------------
async def test_in_process_helpers_and_attributes() -> None:
    c = Collector(counting, frames_per_batch=7, total_frames=14, worker_idx=5)
    with anyio.fail_after(30):
        async with c:
            assert c.worker_idx == 5 and await c.get_distant_attr("worker_idx") == 5
            # TorchRL's frames_per_batch is steps per env; the requested count covers the env batch.
            assert c.frames_per_batch == 4 and c.requested_frames_per_batch == 8
            assert await c.map_fn("get_distant_attr", list_of_args=[("worker_idx",), ("frames_per_batch",)]) == [5, 4]
            with pytest.raises(ValueError, match="same length"):
                await c.map_fn("get_distant_attr", list_of_args=[("worker_idx",)], list_of_kwargs=[{}, {}])
            assert await c.cascade_execute("stats") == c.stats()
            assert await c.cascade_execute("total_frames") == 14
            assert await c.getattr_env("index") is c.env.index
            assert c.env is c._env and c.replay_buffer is None and c.policy is None
            assert await c.next() is not None
    assert Collector(counting, frames_per_batch=8).total_frames == math.inf


async def test_torchrl_env_is_shown_as_itself() -> None:
    pytest.importorskip("torchrl")
    from torchrl.envs import EnvBase, TransformedEnv
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    with anyio.fail_after(60):
        async with Collector(ContinuousActionVecMockEnv, frames_per_batch=8, total_frames=8,
                             max_frames_per_traj=5) as c:  # fmt: skip
            assert isinstance(c.env, EnvBase) and isinstance(c.env, TransformedEnv)  # with its StepCounter
            assert await c.getattr_env("batch_size") == torch.Size([])


def test_blocking_twin_helpers_next_rollout_and_iterator() -> None:
    c = BlockingCollector(counting, frames_per_batch=6, total_frames=12, worker_idx=1)
    try:
        assert c.get_distant_attr("worker_idx") == 1
        assert c.map_fn("get_distant_attr", [("frames_per_batch",)]) == [3]
        assert c.rollout().shape == (2, 3)  # one batch, counted
        assert c.stats()["frames"] == 6
        assert c.next() is not None
        assert c.next() is None  # the budget is spent: None, as TorchRL's next()
    finally:
        c.shutdown()
    c = BlockingCollector(counting, frames_per_batch=6, total_frames=12)
    assert len(list(c.iterator())) == 2


async def test_rollout_is_refused_inside_async_with() -> None:
    with anyio.fail_after(30):
        async with Collector(counting, frames_per_batch=6, total_frames=12) as c:
            with pytest.raises(RuntimeError, match=r"^rollout\(\) collects outside iteration"):
                await c.rollout()


# -- worker processes ------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_worker_helpers_answer_from_each_worker(cls: type, backend: str) -> None:
    with anyio.fail_after(60):
        async with cls(counting, num_workers=2, frames_per_batch=12, total_frames=24, backend=backend) as c:
            assert await c.get_distant_attr("worker_idx") == [0, 1]
            args = [("worker_idx",), ("requested_frames_per_batch",)]
            fpb = 6 if cls is MultiSyncCollector else 12
            assert await c.map_fn("get_distant_attr", list_of_args=args) == [0, fpb]
            with pytest.raises(ValueError, match="Expected 2 argument entries"):
                await c.map_fn("get_distant_attr", list_of_args=[("worker_idx",)])
            assert torch.equal(await c.getattr_env("index"), torch.tensor([0.0, 1.0]))  # worker 0's env
            async for _ in c:
                pass
            stats = await c.map_fn("stats")
            assert [s["frames"] >= fpb for s in stats] == [True, True]
            with pytest.raises(AttributeError, match="nope") as info:
                await c.get_distant_attr("env.nope")
            assert "raised in worker 0" in "\n".join(getattr(info.value, "__notes__", []))
            assert await c.get_distant_attr("worker_idx") == [0, 1]  # the workers are still running


@pytest.mark.timeout(120)
async def test_replay_buffer_paths_answer_for_the_shared_buffer() -> None:
    rb = ReplayBuffer(1000)
    try:
        async with MultiSyncCollector(counting, num_workers=2, frames_per_batch=12, total_frames=24,
                                      replay_buffer=rb) as c:  # fmt: skip
            with anyio.fail_after(60):
                async for _ in c:
                    pass
                assert await c.map_fn("replay_buffer.__len__") == [len(rb)] * 2 == [24, 24]
                assert await c.get_distant_attr("replay_buffer.write_count") == [rb.write_count] * 2
                assert await c.getattr_rb("write_count") == 24
    finally:
        await rb.aclose()


@pytest.mark.timeout(120)
def test_blocking_multi_helpers() -> None:
    with BlockingMultiAsync(counting, num_workers=2, frames_per_batch=12, total_frames=12) as c:
        assert c.get_distant_attr("worker_idx") == [0, 1]
        assert c.getattr_policy("__class__") is type(None)  # random actions: no policy module
        assert c.map_fn("cascade_execute", list_of_args=[("worker_idx",), ("worker_idx",)]) == [0, 1]


async def test_node_collectors_say_what_they_cannot_do() -> None:
    c = DistributedCollector([counting, counting], frames_per_batch=12, total_frames=24, launcher="mp")
    with pytest.raises(NotImplementedError, match=r"^DistributedCollector does not support map_fn\('stats'\)"):
        await c.map_fn("stats")
    with pytest.raises(NotImplementedError, match="does not support pre_collect_hook"):
        c.pre_collect_hook = print
    with pytest.raises(NotImplementedError, match=r"does not support enable_profile\(\)"):
        c.enable_profile()

"""``stats()`` reads as TorchRL's dict and as aiocollect's record, for every collector."""

from __future__ import annotations

import copy
import json
import pickle

import anyio
import pytest

from aiocollect import Collector, CollectorStats, MultiAsyncCollector, MultiSyncCollector
from aiocollect.blocking import Collector as BlockingCollector
from aiocollect.blocking import MultiSyncCollector as BlockingMultiSync
from aiocollect.testing import CountingEnv

pytestmark = pytest.mark.anyio


def counting() -> CountingEnv:
    return CountingEnv(2, episode_length=3)


# -- the record itself ---------------------------------------------------------------------------
def test_stats_is_a_read_only_dict_with_attributes() -> None:
    s = CollectorStats(frames=8, batches=1, total_frames=None, completed=False, policy_version=0)
    assert isinstance(s, dict)
    assert s["frames"] == s.frames == 8
    assert s.get("policy_version") == 0
    assert "total_frames" not in s and s.total_frames is None  # absent (endless), neutral as an attribute
    assert s.workers == 0 and s.stalled_workers == ()
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = s.nope
    for change in (lambda: s.__setitem__("frames", 1), lambda: s.update(frames=1), lambda: s.pop("frames")):
        with pytest.raises(TypeError, match="read-only snapshot"):
            change()
    with pytest.raises(AttributeError):
        s.frames = 1  # type: ignore[misc]
    assert s["frames"] == 8


def test_stats_survives_json_pickle_and_copy() -> None:
    s = CollectorStats(frames=8, batches=1, completed=True, stalled_workers=(1,), policy_version=2)
    assert json.loads(json.dumps(s)) == {
        "frames": 8, "batches": 1, "completed": True, "stalled_workers": [1], "policy_version": 2
    }  # fmt: skip
    for clone in (pickle.loads(pickle.dumps(s)), copy.copy(s), copy.deepcopy(s)):
        assert type(clone) is CollectorStats and clone == s
    assert dict(s) == s.as_dict() and type(s.as_dict()) is dict


# -- in-process --------------------------------------------------------------------------------
async def test_in_process_stats_have_torchrl_keys() -> None:
    with anyio.fail_after(30):
        async with Collector(counting, frames_per_batch=8, total_frames=16) as c:
            before = c.stats()
            seen = [c.stats()["frames"] async for _ in c]
            after = c.stats()
    assert before["frames"] == 0 and before["batches"] == 0 and not before["completed"]
    assert before["total_frames"] == 16 and before["requested_frames_per_batch"] == 8
    assert seen == [8, 16]
    assert after["batches"] == 2 and after["completed"] and after["policy_version"] == 0
    assert json.loads(json.dumps(after))["frames"] == 16
    assert "workers" not in after  # an in-process collector has none


async def test_endless_collector_leaves_total_frames_out() -> None:
    with anyio.fail_after(30):
        async with Collector(counting, frames_per_batch=8) as c:
            await c.__anext__()
            s = c.stats()
    assert "total_frames" not in s and s.total_frames is None and not s.completed


def test_blocking_twin_stats_are_subscriptable() -> None:
    with BlockingCollector(counting, frames_per_batch=8, total_frames=8) as c:
        for _ in c:
            pass
        s = c.stats()
    assert s["frames"] == 8 and json.loads(json.dumps(s))["batches"] == 1


# -- multi-worker --------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize("backend", ["inline", "subprocess"])
async def test_multi_stats_aggregate_per_worker_and_both(cls: type, backend: str) -> None:
    with anyio.fail_after(60):
        async with cls(counting, num_workers=2, frames_per_batch=12, total_frames=48, backend=backend) as c:
            with pytest.raises(ValueError, match=r"^workers must be one of 'aggregate', 'per_worker' or 'both', got"):
                c.stats(workers="bogus")
            async for _ in c:
                pass
            aggregate, per_worker, both = c.stats(), c.stats(workers="per_worker"), c.stats(workers="both")
    assert aggregate["workers"] == 2 and aggregate["workers_alive"] == 2 and aggregate["frames"] == 48
    assert "worker_0/frames" not in aggregate
    assert "frames" not in per_worker and per_worker["workers"] == 2
    assert per_worker["worker_0/frames"] + per_worker["worker_1/frames"] == 48  # counted as delivered
    assert per_worker["worker_0/batches"] + per_worker["worker_1/batches"] == aggregate["batches"] * (
        2 if cls is MultiSyncCollector else 1
    )
    assert per_worker["worker_1/alive"] and per_worker["worker_0/restarts"] == 0
    assert both.keys() == aggregate.keys() | per_worker.keys()
    assert json.loads(json.dumps(both))["worker_1/frames"] == per_worker["worker_1/frames"]


@pytest.mark.timeout(120)
def test_blocking_multi_stats_take_workers() -> None:
    with BlockingMultiSync(counting, num_workers=2, frames_per_batch=12, total_frames=12, backend="inline") as c:
        for _ in c:
            pass
        s = c.stats(workers="both")
    assert s["worker_0/frames"] == 6 and s["frames"] == 12

"""The shared weight store: publishing while workers load, and the version each batch names."""

from __future__ import annotations

import os
import threading

import anyio
import anyio.to_thread
import pytest
import torch
from _weight_policies import VersionEcho
from tensordict import TensorDict

from aiocollect import MultiAsyncCollector
from aiocollect._workers._weights import WeightBlock
from aiocollect.testing import CountingEnv, ScriptedPolicy

pytestmark = pytest.mark.timeout(120)

BIG = 1 << 20  # floats: a copy long enough for a reader and a writer to overlap


def test_a_reader_never_loads_a_torn_mix_of_two_versions() -> None:
    layout = [("w", (BIG,), torch.float32)]
    writer = WeightBlock(layout)
    reader = WeightBlock(layout, os.dup(writer.block.fd))  # as a worker maps it
    reader.close()
    writer.copy_in({"w": torch.zeros(BIG)}, 0)
    done = threading.Event()

    def publish() -> None:  # torch's copies release the GIL: the two threads overlap
        try:
            for v in range(1, 301):
                writer.copy_in({"w": torch.full((BIG,), float(v))}, v)
        finally:
            done.set()

    out = torch.empty(BIG)
    copies = 0

    def into(views: dict) -> None:
        nonlocal copies
        copies += 1
        out.copy_(views["w"])

    thread = threading.Thread(target=publish)
    thread.start()
    reads, last = 0, -1
    try:
        while not done.is_set():
            version = reader.read(into, None)
            lo, hi = float(out.min()), float(out.max())
            assert lo == hi == version, f"read version {version} as values {lo}..{hi}"
            assert version >= last  # never an older version after a newer one
            reads, last = reads + 1, version
    finally:
        thread.join()
    assert reads > 0
    assert reader.read(into, None) == 300 and float(out.min()) == float(out.max()) == 300.0
    writer.close()


def test_a_reader_that_holds_the_version_copies_nothing() -> None:
    layout = [("w", (4,), torch.float32)]
    block = WeightBlock(layout)
    block.copy_in({"w": torch.ones(4)}, 3)
    calls: list[int] = []
    assert block.read(lambda views: calls.append(1), 3) == 3
    assert calls == []
    assert block.read(lambda views: calls.append(1), 2) == 3
    assert calls == [1]
    block.close()


@pytest.mark.anyio
async def test_weights_of_the_wrong_shape_are_refused_before_anything_is_published(backend: str) -> None:
    with anyio.fail_after(60):
        async with MultiAsyncCollector(CountingEnv, ScriptedPolicy(1.0), num_workers=2, frames_per_batch=8,
                                       backend=backend) as c:  # fmt: skip
            await c.__anext__()
            with pytest.raises(
                ValueError, match=r"^weights entry 'weight' must have the policy's shape \(\), got \(2,\); "
            ):
                await c.update_policy_weights_({"weight": torch.tensor([-1.0, -1.0])})
            assert c.policy_version == 0
            batch = await c.__anext__()
    assert (batch["collector", "policy_version"] == 0).all()
    assert torch.equal(batch["action"], ScriptedPolicy(1.0)(batch["observation"]))


@pytest.mark.anyio
async def test_updates_published_back_to_back_reach_every_worker_whole_and_named(backend: str) -> None:
    # Updates follow each other faster than the workers load them (each worker loads at the end
    # of its batch): every frame's weights are one whole version, the version its batch names.
    last = 8
    with anyio.fail_after(90):
        async with MultiAsyncCollector(CountingEnv, VersionEcho(0.0), num_workers=2, frames_per_batch=200,
                                       backend=backend) as c:  # fmt: skip
            newest: dict[int, int] = {0: 0, 1: 0}
            version = 0
            while min(newest.values()) < last:
                for _ in range(2 if version < last else 0):  # two at a time: the store runs ahead
                    version += 1
                    await c.update_policy_weights_(VersionEcho(float(version)))
                batch = await c.__anext__()
                (w,) = batch["collector", "worker_id"].unique().tolist()
                (named,) = batch["collector", "policy_version"].unique().tolist()  # one version per batch
                assert (batch["seen"] == float(named)).all(), (named, batch["seen"].unique())
                assert named >= newest[w]  # a worker never goes back to older weights
                newest[w] = named


class _Gate:
    """Holds a worker thread (inline backend) inside its env factory until the test opens it."""

    building = threading.Event()
    opened = threading.Event()


def _gated_env() -> CountingEnv:  # module level: a worker spec pickles it by reference
    _Gate.building.set()
    _Gate.opened.wait(30)
    return CountingEnv(1)


@pytest.mark.anyio
async def test_an_update_while_a_worker_starts_reaches_it_before_its_first_batch() -> None:
    # The worker's spec (and the weights it starts from) was made before the update: it must
    # still collect its first batch with the new weights, and say so.
    _Gate.building.clear()
    _Gate.opened.clear()
    c = MultiAsyncCollector(_gated_env, ScriptedPolicy(1.0), num_workers=1, frames_per_batch=8, backend="inline")
    got: list[TensorDict] = []

    async def run() -> None:
        async with c:
            got.append(await c.__anext__())

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await anyio.to_thread.run_sync(_Gate.building.wait)  # the worker is being built
                await c.update_policy_weights_(ScriptedPolicy(-1.0))
                _Gate.opened.set()
    finally:
        _Gate.opened.set()
    (batch,) = got
    assert (batch["collector", "policy_version"] == 1).all()
    assert torch.equal(batch["action"], ScriptedPolicy(-1.0)(batch["observation"]))

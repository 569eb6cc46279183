"""Long runs: nothing a collector owns grows from one batch to the next.

A collector that leaks a little per batch runs for an hour and is killed by the OOM killer
overnight (pytorch/rl#2644: "Killed" after ~180k steps; #1823: memory never released). So
each test here warms a collector up (1000 batches), measures what it holds, collects 800 more
batches (with weight updates along the way, as a trainer makes them) and measures again:

- Python objects the garbage collector tracks (a batch, a tensor or a message kept by
  mistake is one or more per batch);
- bytes allocated through Python's allocators (``tracemalloc``: a leak of about 60 bytes
  per batch shows over 800 batches);
- open file descriptors, threads and child processes (one per batch, or a slow climb, ends in
  ``Errno 24`` or a process table full of zombies);
- for worker processes, their resident memory (a leak inside a worker is invisible to the
  parent's allocator).

Warm-up is long enough for the caches that fill once (torch's and anyio's own allocations)
to be full; after it the counts stay flat, and the bounds sit above
the noise measured on 2026-12-02 (under 70 objects and 27 KiB over 800 batches).
"""

from __future__ import annotations

import gc
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
import psutil
import pytest
import torch
from tensordict import TensorDictBase

import aiocollect
from aiocollect import MultiAsyncCollector, MultiSyncCollector
from aiocollect.testing import CountingEnv, ScriptedPolicy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

WARMUP = 1000  # batches before the first measurement (torch 2.3 fills its caches by then)
RUN = 800  # batches between the two measurements
UPDATE_EVERY = 25  # a weight update every this many batches


def counting_env() -> CountingEnv:
    return CountingEnv(2, episode_length=7)


@dataclass(frozen=True)
class Held:
    objects: int
    traced: int
    fds: int
    threads: int
    children: int
    children_rss: int

    def growth(self, later: Held) -> dict[str, int]:
        return {name: getattr(later, name) - getattr(self, name) for name in self.__dataclass_fields__}


def held() -> Held:
    gc.collect()
    me = psutil.Process()
    children = me.children(recursive=True)
    return Held(
        objects=len(gc.get_objects()),
        traced=tracemalloc.get_traced_memory()[0],
        fds=me.num_fds(),
        threads=threading.active_count(),
        children=len(children),
        children_rss=sum(c.memory_info().rss for c in children),
    )


def check_flat(before: Held, after: Held) -> None:
    grew = before.growth(after)
    # One object kept per batch would be RUN objects; the noise is a few dozen (tasks and
    # cancel scopes alive at the moment of the count).
    assert grew["objects"] <= RUN // 10, grew
    # 64 bytes kept per batch would be 50 KiB. The noise is torch's and anyio's own
    # allocations, made and freed at their pace: up to 17 KiB with torch 2.13, and 27 KiB
    # with torch 2.3 (the floor), whose caches fill slowly for thousands of batches.
    assert grew["traced"] <= 48 * 1024, grew
    assert max(grew["fds"], grew["children"]) <= 0, grew
    # A leak here is one per batch, hundreds in all. anyio's thread pool may end an idle
    # worker thread in between, or start one more when two calls overlap: one either way.
    assert grew["threads"] <= 1, grew
    # A worker keeping its batch (about 1 KiB here) each time would add 0.6 MiB per worker;
    # page-granular RSS has moved by under 0.5 MiB in all.
    assert grew["children_rss"] <= 2 * 1024 * 1024, grew


@pytest.fixture
def traced() -> Iterator[None]:
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        yield
    finally:
        if not was_tracing:
            tracemalloc.stop()


async def collect_and_measure(
    collector: aiocollect.Collector | MultiSyncCollector | MultiAsyncCollector, policy: ScriptedPolicy
) -> None:
    """Run ``collector`` for WARMUP + RUN batches, changing ``policy``'s weights; check nothing grew."""
    seen = 0
    before = None
    with anyio.fail_after(180):
        async with collector:
            async for batch in collector:
                assert batch.numel() == 16  # every batch whole, to the last
                seen += 1
                if seen % UPDATE_EVERY == 0:
                    with torch.no_grad():
                        policy.weight.mul_(-1.0)
                    await collector.update_policy_weights_(policy)
                if seen == WARMUP:
                    before = held()
                if seen == WARMUP + RUN:
                    after = held()
                    break
    assert before is not None
    check_flat(before, after)


async def test_an_in_process_collector_holds_no_more_after_hundreds_of_batches(traced: None) -> None:
    policy = ScriptedPolicy()
    collector = aiocollect.Collector(counting_env, policy, frames_per_batch=16, total_frames=-1)
    await collect_and_measure(collector, policy)


@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
async def test_worker_processes_and_their_parent_hold_no_more_after_hundreds_of_batches(
    cls: type[MultiSyncCollector] | type[MultiAsyncCollector], traced: None
) -> None:
    policy = ScriptedPolicy()
    collector = cls([counting_env, counting_env], policy, frames_per_batch=16, total_frames=-1, backend="subprocess")
    await collect_and_measure(collector, policy)


def run_blocking(on_batch: Callable[[aiocollect.SyncDataCollector, int, TensorDictBase], None]) -> tuple[Held, Held]:
    """Run a blocking twin for WARMUP + RUN batches, calling ``on_batch``; what it held at both ends."""
    collector = aiocollect.SyncDataCollector(counting_env, ScriptedPolicy(), frames_per_batch=16, total_frames=-1)
    before = None
    try:
        for seen, batch in enumerate(collector, start=1):
            on_batch(collector, seen, batch)
            if seen == WARMUP:
                before = held()
            if seen == WARMUP + RUN:
                after = held()
                break
    finally:
        collector.shutdown()
    assert before is not None
    return before, after


def test_the_blocking_twin_holds_no_more_after_hundreds_of_batches(traced: None) -> None:
    def on_batch(collector: aiocollect.SyncDataCollector, seen: int, batch: TensorDictBase) -> None:
        assert batch.numel() == 16
        if seen % UPDATE_EVERY == 0:
            policy = collector.policy
            with torch.no_grad():
                policy.weight.mul_(-1.0)
            collector.update_policy_weights_(policy)

    check_flat(*run_blocking(on_batch))


def test_the_measure_sees_a_batch_kept_per_batch(traced: None) -> None:
    """The bounds catch the leak they are there for: one small batch kept per batch."""
    kept = []

    def on_batch(collector: aiocollect.SyncDataCollector, seen: int, batch: TensorDictBase) -> None:
        if seen > WARMUP:
            kept.append(batch["observation"][:1, :1].clone())  # 4 bytes of data, one tensor

    before, after = run_blocking(on_batch)
    grew = before.growth(after)
    assert grew["objects"] >= RUN > RUN // 10, grew
    assert grew["traced"] > 48 * 1024, grew
    with pytest.raises(AssertionError):
        check_flat(before, after)
    assert len(kept) == RUN

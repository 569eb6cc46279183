"""Env and policy code that runs off the event loop gets the caller's torch thread count.

OpenMP's thread count is per thread, so without this a policy stepped in a worker thread
ignores ``torch.set_num_threads`` and every BLAS call fans out to all cores, with the extra
OpenMP threads spinning between calls (a whole core each on the benchmark's MLP).
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable, Iterator

import pytest
import torch

from aiocollect import Collector, SyncDataCollector


def _openmp_max_threads() -> Callable[[], int]:
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc to find the OpenMP runtime torch loaded")
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if re.search(r"/lib[gi]omp[^/]*\.so", line)})
    if not libs:
        pytest.skip("torch is not linked against an OpenMP runtime here")
    return ctypes.CDLL(libs[0]).omp_get_max_threads


@pytest.fixture
def threads() -> Iterator[int]:
    """A torch thread count that differs from OpenMP's default (the number of cores)."""
    saved = torch.get_num_threads()
    n = 1 if (os.cpu_count() or 1) > 1 else 2
    torch.set_num_threads(n)
    yield n
    torch.set_num_threads(saved)


class _RecordingPolicy(torch.nn.Module):
    """Records the stepping thread's OpenMP thread count, then acts like a 4-64-2 MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.omp_max_threads = _openmp_max_threads()
        self.seen: list[int] = []
        self.mlp = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.omp_max_threads())  # before any torch op of ours could set it
        return self.mlp(observation).argmax(-1)


def test_blocking_collector_steps_with_the_callers_thread_count(threads: int) -> None:
    policy = _RecordingPolicy()
    # CartPole's numpy fast path runs no torch op in the stepping thread before the policy.
    with SyncDataCollector("CartPole-v1", policy, frames_per_batch=8, total_frames=16) as c:
        assert sum(b.numel() for b in c) == 16
    assert policy.seen and set(policy.seen) == {threads}


@pytest.mark.anyio
async def test_async_collector_steps_with_the_callers_thread_count(threads: int) -> None:
    policy = _RecordingPolicy()
    async with Collector("CartPole-v1", policy, frames_per_batch=8, total_frames=16) as c:
        assert sum([b.numel() async for b in c]) == 16
    assert policy.seen and set(policy.seen) == {threads}

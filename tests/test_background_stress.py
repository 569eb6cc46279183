"""Stress: shutdown racing background collection, under CPU load (it used to fail 1 run in 20).

``async_shutdown()`` could raise ``CollectorClosedError`` when the background task was
runnable but not yet resumed as shutdown began: the cancellation then landed only at its next
checkpoint, after it had already started another batch on a closed collector. The race needs
the loop to be slow to resume that task, so the runs happen while busy processes compete for
the CPU. ``AIOCOLLECT_STRESS_RUNS`` sets the number of runs (500 reproduces the issue's check).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from aiocollect import SyncDataCollector, blocking
from aiocollect.testing import CountingEnv

RUNS = int(os.environ.get("AIOCOLLECT_STRESS_RUNS", "120"))


@pytest.fixture
def cpu_load() -> Iterator[None]:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def seed_pattern() -> None:
    """The seeds' background pattern with the blocking classes, shut down mid-collection."""
    rb = blocking.ReplayBuffer(10_000, batch_size=32, min_size=256)
    collector = SyncDataCollector(lambda: CountingEnv(4), frames_per_batch=64, replay_buffer=rb)
    collector.start()
    try:
        for _ in range(5):
            assert rb.sample().shape == (32,)
        with collector.pause():
            written = rb.write_count
            rb.sample()
            assert rb.write_count == written
    finally:
        collector.async_shutdown()  # raised CollectorClosedError when the race hit
        rb.close()
    assert not collector.is_running()


@pytest.mark.timeout(600)
def test_background_shutdown_never_races_the_collection_loop(cpu_load: None) -> None:
    for run in range(RUNS):
        try:
            seed_pattern()
        except Exception as exc:
            raise AssertionError(f"run {run + 1} of {RUNS} failed") from exc

"""Who starts and stops Ray: a collector shuts down only the Ray instance it started.

Each case runs in a fresh Python process (Ray is per process), which reports what it saw
and, at its end, every Ray process of its tree that outlived ``ray.shutdown()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import os, time
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
import anyio, psutil, ray
from aiocollect import DistributedCollector, RayCollector
from aiocollect.testing import CountingEnv

CONFIG = {"num_cpus": 2, "_node_ip_address": "127.0.0.1", "include_dashboard": False, "log_to_driver": False}

def env():
    return CountingEnv(1, episode_length=7)

def make(kind, own_ray):
    extra = {"ray_init_config": CONFIG} if own_ray else {}
    if kind == "ray":
        return RayCollector([env] * 2, None, frames_per_batch=10, total_frames=20,
                            remote_configs={"num_cpus": 0.5}, **extra)
    return DistributedCollector([env] * 2, None, frames_per_batch=10, total_frames=20, launcher="ray",
                                remote_configs={"num_cpus": 0.5}, **extra)

def running(p):
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # it exited between children() and status()
        return False

def ray_left():
    deadline = time.monotonic() + 10
    while True:
        left = [p.pid for p in psutil.Process().children(recursive=True) if running(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)

async def main(kind):
    async with make(kind, own_ray=True) as c:
        frames = sum([b.numel() async for b in c])
        print("own", frames, ray.is_initialized(), flush=True)
    print("own-after", ray.is_initialized(), flush=True)
    ray.init(**CONFIG)
    async with make(kind, own_ray=False) as c:
        frames = sum([b.numel() async for b in c])
    print("user-after", frames, ray.is_initialized(), flush=True)
    ray.shutdown()
    print("left", ray_left(), flush=True)

if __name__ == "__main__":
    import sys
    anyio.run(main, sys.argv[1])
"""


@pytest.mark.parametrize("kind", ["ray", "distributed"])
def test_a_collector_shuts_down_the_ray_it_started_and_only_that(tmp_path: Path, kind: str) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script), kind], capture_output=True, text=True, env=env, timeout=200, check=False
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lines == [
        "own 20 True",  # started by the collector...
        "own-after False",  # ...and shut down with it
        "user-after 20 True",  # the user's Ray: used, left running
        "left []",  # nothing of either instance outlived ray.shutdown()
    ], proc.stderr[-3000:]

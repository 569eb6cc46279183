"""`submitit_delayed_launcher` end to end on submitit's local executor, for both frameworks.

Each case is a script run as a user would (``python train.py``): the decorated main runs as
a local submitit job, the node jobs are submitted once it has published its address, and
the collector inside main uses ``launcher="submitit_delayed"``. The script reports what it
collected and every process of its tree left when the call returned (it is a child
subreaper, so a job process orphaned on the way counts too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aiocollect import DistributedCollector, RPCCollector, submitit_delayed_launcher
from aiocollect.testing import CountingEnv

pytest.importorskip("submitit")

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import ctypes, sys, time
import anyio, psutil
from aiocollect import DistributedCollector, RPCCollector, submitit_delayed_launcher
from aiocollect.testing import CountingEnv

FRAMEWORK, USE, FOLDER = sys.argv[1], sys.argv[2], sys.argv[3]

def env():
    return CountingEnv(1, episode_length=7)

@submitit_delayed_launcher(num_jobs=2, framework=FRAMEWORK, folder=FOLDER)
def main(total):
    cls = DistributedCollector if USE == "distributed" else RPCCollector
    async def run():
        async with cls([env] * 2, None, frames_per_batch=20, total_frames=total, sync=True,
                       launcher="submitit_delayed", join_timeout=120) as c:
            return [sorted(set(b["collector", "worker_id"].flatten().tolist())) async for b in c]
    return anyio.run(run)

def running(p):
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # it exited between children() and status()
        return False

def left():
    deadline = time.monotonic() + 10
    while True:
        procs = [p.pid for p in psutil.Process().children(recursive=True) if running(p)]
        if not procs or time.monotonic() > deadline:
            return procs
        time.sleep(0.1)

if __name__ == "__main__":
    # A child subreaper: a job process orphaned by its killed controller comes back here
    # (instead of to init) and is seen by left().
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
    try:
        print("batches", main(60), flush=True)
    except Exception as exc:
        print("error", str(exc).replace("\\n", " | "), flush=True)
    print("left", left(), flush=True)
"""


def run(tmp_path: Path, framework: str, use: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1"}
    proc = subprocess.run(
        [sys.executable, str(script), framework, use, str(tmp_path / "jobs")],
        capture_output=True, text=True, env=env, timeout=200, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


@pytest.mark.parametrize("framework", ["distributed", "rpc"])
def test_nodes_launched_ahead_serve_the_collector_in_main(tmp_path: Path, framework: str) -> None:
    lines = run(tmp_path, framework, framework)
    assert lines == ["batches [[0, 1], [0, 1], [0, 1]]", "left []"], lines


def test_a_framework_mismatch_is_an_error_not_a_hang(tmp_path: Path) -> None:
    lines = run(tmp_path, "rpc", "distributed")
    assert lines[0].startswith("error ") and lines[1] == "left []", lines
    assert "submitit_delayed_launcher(framework='rpc') launched nodes for another collector" in lines[0]


def test_submitit_delayed_outside_the_decorator_says_how_to_use_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIOCOLLECT_SUBMITIT_DELAYED", raising=False)
    for cls in (DistributedCollector, RPCCollector):
        with pytest.raises(ValueError, match=r"^launcher='submitit_delayed' connects to the node jobs of submitit_del"):
            cls([CountingEnv] * 2, None, frames_per_batch=10, launcher="submitit_delayed")


def test_bad_decorator_arguments_fail_at_once() -> None:
    with pytest.raises(ValueError, match=r"^framework must be 'distributed' or 'rpc', got 'ray'$"):
        submitit_delayed_launcher(2, framework="ray")
    with pytest.raises(ValueError, match=r"^num_jobs must be a positive int, got 0$"):
        submitit_delayed_launcher(0)
    with pytest.raises(ValueError, match=r"^framework='rpc' carries tensors in RPC messages, so backend must be"):
        submitit_delayed_launcher(2, framework="rpc", backend="nccl")

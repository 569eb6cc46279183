"""Shutdown paths that are not plain exits: Ctrl-C in a blocking script, garbage collection."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aiocollect import Collector
from aiocollect.testing import CountingEnv

SCRIPT = textwrap.dedent(
    """
    import faulthandler, signal, sys
    faulthandler.register(signal.SIGUSR1)  # the test dumps our stacks if we hang
    from aiocollect import SyncDataCollector
    from aiocollect.testing import CountingEnv

    env = CountingEnv(4, episode_length=10**9)
    try:
        with SyncDataCollector(lambda: env, frames_per_batch=400_000) as c:
            print("collecting", flush=True)
            for _ in c:
                pass
    except KeyboardInterrupt:
        print("interrupted; env closed:", env.closed, flush=True)
        sys.exit(3)
    """
)


@pytest.mark.timeout(60)
def test_ctrl_c_in_blocking_script_stops_and_closes(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    # (stderr is inherited, so a stack dump shows up in pytest's captured output)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "collecting"
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, out
    assert "interrupted; env closed: True" in out


@pytest.mark.anyio
async def test_unclosed_collector_warns_and_closes_env_on_gc() -> None:
    env = CountingEnv(1)
    c = Collector(lambda: env, frames_per_batch=4)
    await c.__anext__()
    with pytest.warns(ResourceWarning, match="unclosed"):
        del c
        gc.collect()
    assert env.closed

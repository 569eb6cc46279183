"""Shutdown paths that are not plain exits: Ctrl-C in a blocking script, garbage collection."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from aiocollect import Collector, SyncDataCollector
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


class _CtrlCEnv(CountingEnv):
    """Sends the process a SIGINT (as Ctrl-C does) at one step, and optionally when closed.

    The env steps in a worker thread, so the signal lands in the main thread wherever it
    happens to be: inside the portal's wait, in the loop body, or in between.
    """

    def __init__(self, at_step: int, *, again_on_close: bool = False) -> None:
        super().__init__(2, episode_length=3)
        self.at_step = at_step
        self.again_on_close = again_on_close
        self.steps = 0

    def step(self, action):  # type: ignore[no-untyped-def]
        if self.steps == self.at_step:
            os.kill(os.getpid(), signal.SIGINT)
        self.steps += 1
        return super().step(action)

    def close(self) -> None:
        if self.again_on_close:
            os.kill(os.getpid(), signal.SIGINT)
        super().close()


@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT is delivered differently on Windows")
def test_ctrl_c_at_any_point_raises_once_and_leaves_nothing_running() -> None:
    # frames_per_batch=4 over 2 envs: the signal lands before, inside and between batches.
    for at_step in range(24):
        env = _CtrlCEnv(at_step, again_on_close=at_step % 3 == 0)
        before = set(threading.enumerate())
        with pytest.raises(KeyboardInterrupt):
            with SyncDataCollector(lambda env=env: env, frames_per_batch=4) as c:
                for _ in c:
                    pass
        assert env.closed, at_step  # a second Ctrl-C during teardown does not cut it short
        assert set(threading.enumerate()) - before == set(), at_step


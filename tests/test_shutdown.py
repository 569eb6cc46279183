"""Shutdown paths that are not plain exits: Ctrl-C in a blocking script, garbage collection."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import weakref
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
import torch

from aiocollect import Collector, SyncDataCollector
from aiocollect._core._threads import ThreadLane
from aiocollect.testing import CountingEnv, HangingEnv

try:  # works whether or not tests/ is a package
    from ._leaks import run_script
except ImportError:
    from _leaks import run_script

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


EXIT_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    import torch
    from tensordict import TensorDict
    from aiocollect import MultiaSyncDataCollector, MultiSyncDataCollector, SyncDataCollector, blocking
    from aiocollect.testing import CountingEnv, HangingEnv

    if __name__ == "__main__":  # (worker processes import this file too)
        mode = sys.argv[1]
        rb = blocking.ReplayBuffer(10_000, batch_size=4, min_size=8)
        if mode == "buffer":  # a sample that waits runs through the buffer's portal thread
            threading.Timer(0.1, rb.extend, [TensorDict(observation=torch.arange(8.0), batch_size=[8])]).start()
            rb.sample()
        elif mode == "background":  # collecting in the background when the script ends
            collector = SyncDataCollector(lambda: CountingEnv(4), frames_per_batch=64, replay_buffer=rb)
            collector.start()
            rb.sample()
        elif mode == "iterating":  # a blocking collector iterated by hand, never shut down
            collector = SyncDataCollector(lambda: CountingEnv(4), frames_per_batch=64)
            next(iter(collector))
        elif mode == "stuck":  # the env's step never returns
            collector = SyncDataCollector(lambda: HangingEnv(1, hang_at=3), frames_per_batch=2, shutdown_timeout=0.5)
            it = iter(collector)
            next(it)
            threading.Thread(target=next, args=(it,), daemon=True).start()
        elif mode == "workers":  # worker processes collecting when the script ends
            collector = MultiaSyncDataCollector([lambda: CountingEnv(2)] * 2, frames_per_batch=64)
            next(iter(collector))
        elif mode == "workers-stuck":  # the workers' steps never return, and a call waits on them
            collector = MultiSyncDataCollector([lambda: HangingEnv(1, hang_at=3)] * 2, frames_per_batch=4,
                                               shutdown_timeout=0.5)
            it = iter(collector)
            next(it)
            threading.Thread(target=next, args=(it,), daemon=True).start()
        elif mode in ("central-threads", "central-processes"):  # envs in shards, iterated by hand
            backend = mode.split("-")[1].replace("processes", "multiprocessing").replace("threads", "threading")
            import gymnasium

            collector = blocking.AsyncBatchedCollector([lambda: gymnasium.make("CartPole-v1")] * 4, frames_per_batch=64,
                                                       env_backend=backend, envs_per_worker=2)
            next(iter(collector))
        print("leaving without closing anything", flush=True)
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "mode",
    ["buffer", "background", "iterating", "stuck", "workers", "workers-stuck", "central-threads", "central-processes"],
)
def test_a_script_that_leaves_blocking_objects_open_still_exits(tmp_path: Path, mode: str) -> None:
    # Finalizers and exit hooks must never wait on a portal (they used to deadlock in
    # Future.result() at interpreter exit), daemon threads must be out of torch's C++ code
    # before the interpreter finalizes (or the process aborts), and worker processes must
    # not outlive the script.
    script = tmp_path / "script.py"
    script.write_text(EXIT_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc, leaked = run_script([sys.executable, "-X", "faulthandler", str(script), mode], timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "leaving without closing anything\n"
    assert not leaked, "the script left processes behind:\n  " + "\n  ".join(leaked)


@pytest.mark.anyio
@pytest.mark.all_backends
async def test_an_idle_lane_keeps_nothing_of_its_last_call() -> None:
    # An idle lane's thread must hold no tensor: woken after the interpreter began to
    # finalize (the exit hook, or teardown, sends it its end), freeing one there re-takes the
    # GIL inside torch's C++ code and the forced thread exit aborts the process (one CI run
    # in ~20 of the 'stuck' exit script above died so).
    lane = ThreadLane()
    made: list[weakref.ref[torch.Tensor]] = []

    def plus_one(arg: torch.Tensor) -> torch.Tensor:
        out = arg + 1
        made.append(weakref.ref(out))
        return out

    arg = torch.zeros(3)
    refs = [weakref.ref(arg)]
    out = await lane.run(plus_one, arg)
    assert out.tolist() == [1.0, 1.0, 1.0]
    del arg, out
    try:
        assert await anyio.to_thread.run_sync(lane.wait_idle_blocking, 5.0)
        gc.collect()
        assert [r() for r in refs + made] == [None, None]
    finally:
        await lane.aclose()


@pytest.mark.anyio
async def test_asyncio_collector_with_a_stuck_env_lets_the_loop_end() -> None:
    # The stuck step runs on a daemon thread the collector owns: leaving 'async with' warns
    # and returns within shutdown_timeout, and nothing joins that thread at exit.
    env = HangingEnv(1, hang_at=3)
    try:
        with pytest.warns(
            RuntimeWarning, match=r"^the env did not finish its step and close within shutdown_timeout=0.5s"
        ):
            with anyio.move_on_after(0.5):
                async with Collector(lambda: env, frames_per_batch=2, shutdown_timeout=0.5) as c:
                    async for _ in c:
                        pass
        lanes = [t for t in threading.enumerate() if t.name == "aiocollect lane"]
        assert lanes and all(t.daemon for t in lanes)
    finally:
        env.release.set()  # let the thread go, so the test leaves nothing running


def test_unclosed_blocking_buffer_warns_and_frees_without_waiting() -> None:
    from aiocollect import blocking

    rb = blocking.ReplayBuffer(100, batch_size=2)
    rb.wait_for(0)  # starts the portal thread
    portal_threads = [t for t in threading.enumerate() if t.name.endswith("ReplayBuffer portal")]
    assert len(portal_threads) == 1
    inner = rb._async
    with pytest.warns(ResourceWarning, match=r"^unclosed <blocking\.ReplayBuffer"):
        del rb
        gc.collect()
    assert inner.closed
    portal_threads[0].join(5)
    assert not portal_threads[0].is_alive()

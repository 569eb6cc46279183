"""Multi-process shutdown paths: parent death, GC, blocking scripts, weight-sync timeouts."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
from functools import partial
from pathlib import Path

import anyio
import pytest
import torch
from _leaks import still_running
from _weight_policies import HangsWhenLoading

from aiocollect import CollectorClosedError, MultiAsyncCollector, MultiSyncCollector
from aiocollect.testing import CountingEnv, ScriptedPolicy

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]


def run_script(tmp_path: Path, body: str) -> subprocess.Popen[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    # TMPDIR under tmp_path: a script these tests SIGKILL cannot remove its multiprocessing
    # temp dir (/tmp/pymp-*, the fork server's socket); pytest cleans tmp_path up.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip


def test_workers_exit_when_the_parent_is_killed(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import anyio
        from aiocollect import MultiAsyncCollector
        from aiocollect.testing import CountingEnv

        def env():
            return CountingEnv(0, episode_length=10**9)

        async def main():
            async with MultiAsyncCollector(env, num_workers=2, frames_per_batch=1000) as c:
                await c.__anext__()
                print(*c._worker_pids(), flush=True)
                await anyio.sleep_forever()

        if __name__ == "__main__":
            anyio.run(main)
    """,
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.kill()
        proc.wait(10)
        assert still_running(pids, 10) == []
    finally:
        proc.kill()
        proc.communicate()


def test_ctrl_c_in_blocking_multisync_script(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        import sys
        from aiocollect import MultiSyncDataCollector
        from aiocollect.testing import CountingEnv

        def env():
            return CountingEnv(0, episode_length=10**9)

        if __name__ == "__main__":
            try:
                with MultiSyncDataCollector(env, num_workers=2, frames_per_batch=200) as c:
                    next(c)
                    print(*c._async._worker_pids(), flush=True)
                    for _ in c:
                        pass
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                sys.exit(3)
    """,
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 3, err
        assert "interrupted" in out
        assert still_running(pids, 5) == []
    finally:
        proc.kill()


def test_script_without_main_guard_gets_a_clear_error(tmp_path: Path) -> None:
    proc = run_script(
        tmp_path,
        """
        from aiocollect import MultiSyncDataCollector
        from aiocollect.testing import CountingEnv

        with MultiSyncDataCollector(CountingEnv, num_workers=1, frames_per_batch=4, total_frames=4) as c:
            for _ in c:
                pass
        print("done")
    """,
    )
    _, err = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert 'guard that code with `if __name__ == "__main__":`' in err
    assert err.count("Traceback") < 10  # one failure per worker start, not a crash loop


@pytest.mark.anyio
async def test_unclosed_multi_collector_is_killed_on_gc() -> None:
    c = MultiAsyncCollector(CountingEnv, num_workers=1, frames_per_batch=4)
    with anyio.fail_after(60):
        await c.__anext__()
    pids = c._worker_pids()
    with pytest.warns(ResourceWarning, match="unclosed"):
        del c
        gc.collect()
    assert still_running(pids, 5) == []


def env_that_never_builds() -> CountingEnv:
    threading.Event().wait()
    raise AssertionError("unreachable")


@pytest.mark.anyio
@pytest.mark.parametrize("cls", [MultiAsyncCollector, MultiSyncCollector])
async def test_cancelling_a_bare_async_for_during_startup_stops_every_worker(cls: type) -> None:
    # No 'async with': the collector starts lazily in __anext__, and the cancellation lands
    # while its workers are still starting (their env factory never returns). The no_leaks
    # fixture checks that no worker process, fd or thread is left behind.
    c = cls(env_that_never_builds, num_workers=2, frames_per_batch=8, shutdown_timeout=1.0)
    batches = []

    async def iterate() -> None:
        async for batch in c:
            batches.append(batch)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(iterate)
            await anyio.wait_all_tasks_blocked()  # blocked in worker start-up
            assert c._transport is not None and not c._started
            tg.cancel_scope.cancel()
    assert batches == []
    assert "closed" in repr(c)
    assert all(pid is None for pid in c._worker_pids())  # reaped, not left as zombies
    with pytest.raises(CollectorClosedError):
        await c.__anext__()


class _SaysWhenStepping(CountingEnv):
    """An endless episode that creates ``flag`` at its first step: the test then knows its worker is mid-batch."""

    def __init__(self, flag: Path) -> None:
        super().__init__(0, episode_length=10**9)
        self.flag: Path | None = flag

    def step(self, action):  # type: ignore[no-untyped-def]
        if self.flag is not None:
            self.flag.touch()
            self.flag = None
        return super().step(action)


@pytest.mark.anyio
async def test_a_weight_update_does_not_wait_for_workers_in_the_middle_of_a_batch(tmp_path: Path) -> None:
    # Both workers inside a batch that would take hours: the update is published and queued for
    # them (they load it before their next batch), and the call returns at once instead of
    # holding the trainer back for a whole batch.
    flags = [tmp_path / f"stepping-{w}" for w in range(2)]
    with anyio.fail_after(90):
        async with MultiAsyncCollector([partial(_SaysWhenStepping, f) for f in flags], ScriptedPolicy(1.0),
                                       frames_per_batch=2_000_000, weight_sync_timeout=60) as c:  # fmt: skip
            # Files written by other processes: no event to await, so poll (this orders nothing by time).
            while not all(f.exists() for f in flags):  # noqa: ASYNC110
                await anyio.sleep(0.01)
            with anyio.fail_after(10):  # far below the batch, and below weight_sync_timeout
                await c.update_policy_weights_(ScriptedPolicy(-1.0))
                await c.update_policy_weights_(ScriptedPolicy(2.0))  # and again, the first one still unloaded
            assert c.policy_version == 2


@pytest.mark.anyio
async def test_weight_update_timeout_names_the_late_workers() -> None:
    # Idle workers (a sync collector between batches) are waited for; ones that do not load the
    # weights within weight_sync_timeout are named.
    with anyio.fail_after(90):
        async with MultiSyncCollector(CountingEnv, HangsWhenLoading(), num_workers=2, frames_per_batch=8,
                                      weight_sync_timeout=0.5, shutdown_timeout=2) as c:  # fmt: skip
            await c.__anext__()
            with pytest.raises(TimeoutError, match=r"^workers \[0, 1\] did not apply policy version 1 within") as err:
                await c.update_policy_weights_(ScriptedPolicy(-1.0))
            assert "though they were between batches; raise weight_sync_timeout" in str(err.value)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.anyio
async def test_cuda_policy_in_workers_and_cuda_storing_device() -> None:
    policy = ScriptedPolicy(1.0)
    async with MultiSyncCollector(CountingEnv, policy, num_workers=2, frames_per_batch=8, total_frames=8,
                                  policy_device="cuda", storing_device="cuda") as c:  # fmt: skip
        (batch,) = [b async for b in c]
    assert batch.device.type == "cuda"


@pytest.mark.anyio
async def test_shutdown_cuts_long_batches_short_and_workers_exit_cleanly() -> None:
    # Batches of a million steps: without the stop word a worker would only read "close"
    # after finishing them, long past shutdown_timeout, and would be terminated instead.
    with anyio.fail_after(60):
        async with MultiAsyncCollector(lambda: CountingEnv(0, 10**9), num_workers=2, frames_per_batch=10**6,
                                       shutdown_timeout=30) as c:  # fmt: skip
            await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            await c.aclose()  # already closed by 'async with': returns at once
    assert [p.exitcode for p in c._transport._procs] == [0, 0]  # exited on their own, not terminated


def test_collectors_leave_the_global_start_method_alone(tmp_path: Path) -> None:
    # In a fresh interpreter: the test process may have had a start method chosen by torchrl.
    proc = run_script(
        tmp_path,
        """
        import multiprocessing
        from aiocollect import MultiSyncDataCollector
        from aiocollect.testing import CountingEnv

        if __name__ == "__main__":
            with MultiSyncDataCollector(CountingEnv, num_workers=1, frames_per_batch=4, total_frames=4) as c:
                shapes = [tuple(b.shape) for b in c]
            print(shapes, multiprocessing.get_start_method(allow_none=True))
            multiprocessing.set_start_method("forkserver")  # the user can still choose
            print("chosen", multiprocessing.get_start_method())
    """,
    )
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["[(1, 1, 4)] None", "chosen forkserver"]

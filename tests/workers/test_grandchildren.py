"""Worker processes may start processes of their own, and never leave one behind.

The env of each worker here starts a ``multiprocessing`` child that never ends on its own
(deaf to SIGTERM and SIGINT, blind to its parent's death) and that its ``close()`` leaves
running, or is a TorchRL ``ParallelEnv``. Each test runs with this process as the reaper of
orphans (`orphans_reparented_here`): a grandchild whose worker died is reparented here
instead of to init, so `descendants_left_behind` sees it if it survives.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import torch
from _env_with_a_child import GymEnvWithAChild, env_with_a_child
from _leaks import descendants_left_behind, orphans_reparented_here, run_script

from aiocollect import AsyncCollector, MultiAsyncCollector, MultiSyncCollector, aSyncDataCollector

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(sys.platform != "linux", reason="Linux process tree")]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

#: How long what a collector's close killed may take to be gone (it is SIGKILLed before close returns).
GRACE = 3.0


def descendants(pid: int | None) -> list[psutil.Process]:
    assert pid is not None
    return psutil.Process(pid).children(recursive=True)


def gone(procs: list[psutil.Process], timeout: float) -> bool:
    """Whether all of ``procs`` end within ``timeout`` (reaping those reparented here)."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return not alive


def check_counting(batch: Any) -> None:
    # [workers or 1, envs, time]; each frame is the step after the one before it.
    step, next_step = batch["observation"][..., 2], batch["next", "observation"][..., 2]
    assert torch.equal(next_step, step + 1)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "cls"),
    [("fork", MultiSyncCollector), ("spawn", MultiAsyncCollector), ("forkserver", AsyncCollector)],
)
async def test_worker_env_with_its_own_process_collects_and_leaves_nothing(method: str, cls: type) -> None:
    envs = env_with_a_child(method) if cls is AsyncCollector else [env_with_a_child(method)] * 2
    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        with anyio.fail_after(120):
            async with cls(envs, frames_per_batch=8, total_frames=32, shutdown_timeout=5.0) as c:
                async for batch in c:
                    check_counting(batch)
                    assert all(descendants(pid) for pid in c._worker_pids())  # each worker's child runs
    assert left == []


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["fork", "spawn"])
async def test_env_processes_of_an_async_batched_collector_may_start_processes(method: str, tmp_path: Path) -> None:
    # Its env worker processes were daemonic, so an env with a multiprocessing child (a
    # simulator server, say) failed there: "daemonic processes are not allowed to have
    # children". The children end with their env process, although the env's close leaves them.
    from aiocollect import AsyncBatchedCollector

    make = functools.partial(GymEnvWithAChild, method, str(tmp_path))
    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        with anyio.fail_after(120):
            async with AsyncBatchedCollector([make] * 2, frames_per_batch=8, total_frames=24,
                                             env_backend="multiprocessing", shutdown_timeout=5.0) as c:  # fmt: skip
                async for batch in c:
                    assert torch.equal(batch["next", "observation"], batch["observation"] + 1)
                    children = [psutil.Process(int(name)) for name in os.listdir(tmp_path)]
                    assert len(children) == 2 and all(p.is_running() for p in children)
        assert gone(children, GRACE), "an env's child outlived its env process"
    assert left == []


@pytest.mark.anyio
async def test_an_env_process_killed_while_its_forked_child_lives_is_reported(tmp_path: Path) -> None:
    # The parent learns of an env process's death from its pipe's end of file; a child the env
    # forked held a copy of that pipe, so the parent waited for the step's reply forever.
    from aiocollect import AsyncBatchedCollector, WorkerCrashedError

    make = functools.partial(GymEnvWithAChild, "fork", str(tmp_path))
    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        with anyio.fail_after(120):
            async with AsyncBatchedCollector([make] * 2, frames_per_batch=8, env_backend="multiprocessing",
                                             envs_per_worker=1, shutdown_timeout=5.0) as c:  # fmt: skip
                await c.__anext__()
                children = [psutil.Process(int(name)) for name in os.listdir(tmp_path)]
                victim = children[0].ppid()
                os.kill(victim, signal.SIGKILL)
                with pytest.raises(WorkerCrashedError) as info:
                    while True:
                        await c.__anext__()
                assert info.value.pid == victim
        assert gone(children, GRACE), "an env's child outlived its env process"
    assert left == []


@pytest.mark.timeout(120)
def test_break_out_of_a_blocking_collector_leaves_nothing() -> None:
    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        collector = aSyncDataCollector(env_with_a_child(), frames_per_batch=4, total_frames=-1)
        try:
            for batch in collector:
                check_counting(batch)
                break
        finally:
            collector.shutdown()
    assert left == []


@pytest.mark.anyio
async def test_env_whose_close_hangs_is_ended_with_its_process_by_the_deadline() -> None:
    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        c = MultiSyncCollector([env_with_a_child(hang_on_close=True)] * 2, frames_per_batch=8, shutdown_timeout=0.5)
        try:
            with anyio.fail_after(120):
                check_counting(await c.__anext__())
        finally:
            # Close, then SIGTERM a second later, then SIGKILL; all stops together get 3 deadlines.
            with anyio.fail_after(0.5 * 3 + 1 + 5):
                await c.aclose()
    assert left == []


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["crash", "stall"])
async def test_a_killed_worker_takes_its_processes_along_and_is_restarted(how: str) -> None:
    # crash: the worker dies (SIGKILL from outside, as the OOM killer does) and its env's
    # process is left behind in its group; stall: the worker is stopped, and the watchdog
    # kills it (with worker_timeout and restart_workers) and its group together.
    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        with anyio.fail_after(120):
            async with MultiSyncCollector([env_with_a_child()] * 2, frames_per_batch=8, restart_workers=1,
                                          worker_timeout=1.0 if how == "stall" else None,
                                          shutdown_timeout=5.0) as c:  # fmt: skip
                check_counting(await c.__anext__())
                victim = c._worker_pids()[0]
                orphans = descendants(victim)
                assert orphans
                os.kill(victim, signal.SIGKILL if how == "crash" else signal.SIGSTOP)
                check_counting(await c.__anext__())  # from a fresh worker 0
                assert c.stats().restarts == 1 and c._worker_pids()[0] != victim
                assert gone(orphans, GRACE), "the killed worker's process outlived it"
                assert descendants(c._worker_pids()[0])  # the fresh worker's env started its own
    assert left == []


@pytest.mark.anyio
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize("broken", ["stop", "aclose"])
async def test_a_teardown_that_fails_part_way_still_ends_every_worker_and_its_processes(
    cls: type, broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker's stop that raises before it sends the worker its Close (a bug; anyio before
    # 4.7, which lacks wait_readable, failed in the same teardown) once left every worker and
    # its env's processes running as long as the trainer ran: the teardown's synchronous
    # half, which kills them, was skipped. "stop": one worker's stop fails; "aclose": the
    # whole transport's close fails. The collector's close ends them either way.
    from aiocollect._workers._subprocess import SubprocessTransport

    async def fail(self: Any, *args: Any) -> None:
        raise RuntimeError(f"simulated failure in {broken}{args}")

    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        c = cls([env_with_a_child()] * 2, frames_per_batch=8, shutdown_timeout=5.0)
        with anyio.fail_after(120):
            check_counting(await c.__anext__())
        workers = [psutil.Process(pid) for pid in c._worker_pids()]
        env_children = [child for w in workers for child in w.children(recursive=True)]
        assert len(workers) == 2 and env_children
        monkeypatch.setattr(SubprocessTransport, broken, fail)
        with pytest.raises(Exception) as info:  # the error, or an ExceptionGroup of the stops'
            with anyio.fail_after(30):
                await c.aclose()
        assert f"simulated failure in {broken}" in "".join(traceback.format_exception(info.value))
        assert gone(workers + env_children, GRACE), "a worker or its env's process outlived the failed close"
    assert left == []


PARENT_KILLED = """
    import os, signal, sys
    for name, value in (("GLOO_SOCKET_IFNAME", "lo"), ("TP_SOCKET_IFNAME", "lo"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(name, value)  # loopback only, as the distributed tests
    import anyio
    import aiocollect

    def make():
        if sys.argv[1] == "parallel_env":
            from torchrl.envs import ParallelEnv
            from torchrl.testing.mocking_classes import CountingEnv
            return ParallelEnv(2, CountingEnv)
        sys.path.insert(0, {workers!r})
        from _env_with_a_child import EnvWithAChild
        return EnvWithAChild("spawn")

    async def main():
        if sys.argv[2] == "workers":
            collector = aiocollect.MultiAsyncCollector([make, make], frames_per_batch=8)
        else:  # nodes: local processes that run the env themselves
            collector = getattr(aiocollect, sys.argv[2])([make, make], None, frames_per_batch=8, launcher="mp")
        async with collector:
            await collector.__anext__()
            os.kill(os.getpid(), signal.SIGKILL)  # no teardown of any kind

    if __name__ == "__main__":
        anyio.run(main)
"""


@pytest.mark.parametrize(
    ("env", "collector"),
    [("mp_child", "workers"), ("parallel_env", "workers"), ("mp_child", "DistributedCollector"),
     ("mp_child", "RPCCollector")],
)  # fmt: skip
def test_killing_the_parent_ends_every_descendant(tmp_path: Path, env: str, collector: str) -> None:
    if env == "parallel_env":
        pytest.importorskip("torchrl.testing.mocking_classes")
    if collector != "workers":
        pytest.importorskip("torch.distributed.rpc")
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(PARENT_KILLED.format(workers=str(Path(__file__).parent))))
    # A SIGKILLed process cannot remove its multiprocessing temp dir (/tmp/pymp-*, the fork
    # server's socket): give it one under tmp_path, which pytest cleans up.
    run_env = {**SCRIPT_ENV, "TMPDIR": str(tmp_path)}
    proc, leaked = run_script([sys.executable, str(script), env, collector], timeout=150, env=run_env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert leaked == []


CTRL_C = """
    import sys
    from aiocollect import MultiSyncDataCollector

    sys.path.insert(0, {workers!r})
    from _env_with_a_child import GymEnvWithAChild, env_with_a_child

    if __name__ == "__main__":
        try:
            with MultiSyncDataCollector([env_with_a_child("spawn")] * 2, frames_per_batch=8) as c:
                for _ in c:
                    print("collecting", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
"""


def test_ctrl_c_at_a_terminal_stops_the_script_and_leaves_nothing(tmp_path: Path) -> None:
    # A terminal sends Ctrl-C to its whole foreground process group: the script's own
    # session stands for the terminal's here. Workers and their processes are in sessions
    # of their own, so the script alone is interrupted, and it ends them all.
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(CTRL_C.format(workers=str(Path(__file__).parent))))
    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=SCRIPT_ENV, start_new_session=True)  # fmt: skip
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "collecting\n"
            os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err
    assert "interrupted" in out
    assert left == []


@pytest.mark.anyio
async def test_torchrl_parallel_env_in_a_worker() -> None:
    pytest.importorskip("torchrl.testing.mocking_classes")
    from torchrl.envs import ParallelEnv
    from torchrl.testing.mocking_classes import CountingEnv as TorchRLCountingEnv

    def make() -> ParallelEnv:
        return ParallelEnv(2, TorchRLCountingEnv)

    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        with anyio.fail_after(150):
            async with MultiSyncCollector([make, make], frames_per_batch=16, total_frames=32) as c:
                async for batch in c:
                    assert batch.shape == (2, 2, 4)  # [workers, the ParallelEnv's envs, time]
                    # TorchRL's CountingEnv adds the action to its count.
                    obs, nxt = batch["observation"], batch["next", "observation"]
                    assert torch.equal(nxt, obs + batch["action"].to(obs.dtype))
                    assert all(len(descendants(pid)) >= 2 for pid in c._worker_pids())
    assert left == []


@pytest.fixture(scope="module")
def process_wide_state() -> None:
    """Start before the test's leak snapshot what lives as long as the process.

    The first TCPStore of a process opens a wake-up pipe that torch keeps, and the fork
    server keeps two descriptors too: they are not leaks of the test that comes first.
    """
    dist = pytest.importorskip("torch.distributed")
    from multiprocessing import forkserver

    from aiocollect._workers._prestart import preload_forkserver

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    del store
    gc.collect()
    preload_forkserver(multiprocessing.get_context("forkserver"))
    forkserver.ensure_running()


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["close", "crash"])
async def test_a_local_node_ends_with_the_processes_its_env_started(how: str, process_wide_state: None) -> None:
    # launcher="mp": each node is a local process, whose env is built in the node itself. Its
    # env's child is spawned: a forked one would hold the node's connection to the trainer,
    # which then would not see the node die until the child did.
    from aiocollect import DistributedCollector

    with orphans_reparented_here(), descendants_left_behind(GRACE) as left:
        with anyio.fail_after(120):
            async with DistributedCollector([env_with_a_child("spawn")] * 2, None, frames_per_batch=8, launcher="mp",
                                            node_hosts=["127.0.0.1"] * 2, restart_nodes=1,
                                            shutdown_timeout=5.0) as c:  # fmt: skip
                check_counting(await c.__anext__())
                nodes = [int(pid) for pid in c._worker_pids() if pid is not None]
                assert len(nodes) == 2 and all(descendants(pid) for pid in nodes)
                if how == "crash":
                    orphans = descendants(nodes[0])
                    os.kill(nodes[0], signal.SIGKILL)
                    while c.stats().restarts == 0:  # batches already on their way may come first
                        check_counting(await c.__anext__())
                    assert gone(orphans, GRACE), "the killed node's process outlived it"
    assert left == []

"""The "external" and "submitit" launchers: nodes the collector does not start as its own children.

External nodes are real ``python -m aiocollect.node`` processes started by the test with
torchrun-style variables, as a user would on other machines (here: distinct loopback
addresses). Submitit runs its local executor (no SLURM here), in a per-test folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import psutil
import pytest
import torch
from _leaks import orphans_reparented_here
from _node_envs import scripted

from aiocollect import DistributedCollector, DistributedSyncCollector
from aiocollect._workers import _launch
from aiocollect._workers._ports import held_port
from aiocollect.testing import CountingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
WORKER_ID = ("collector", "worker_id")


def node_env(port: int, rank: int, host: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_PORT")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), AIOCOLLECT_NODE_ADDR=host)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


async def run_node(port: int, rank: int, host: str, **extra: str) -> anyio.abc.Process:
    return await anyio.open_process(
        [sys.executable, "-m", "aiocollect.node"],
        env=node_env(port, rank, host, **extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


async def finish(proc: anyio.abc.Process) -> tuple[int, str]:
    """The node's exit code and stderr (it must exit by itself)."""
    assert proc.stderr is not None
    err = b""
    async with proc.stderr:
        async for chunk in proc.stderr:
            err += chunk
    return await proc.wait(), err.decode()


@asynccontextmanager
async def killed_on_failure(nodes: list[anyio.abc.Process]) -> AsyncIterator[None]:
    """Kill the test's nodes if its body fails (a node whose trainer never came up waits on).

    Otherwise the failure leaves the node running and the test hangs in `finish` until its
    deadline, reported as a timeout and a leak instead of the error that caused it.
    """
    try:
        yield
    except BaseException:
        alive = [proc for proc in nodes if proc.returncode is None]
        with anyio.CancelScope(shield=True), anyio.move_on_after(15):
            for proc in alive:
                proc.kill()
            for proc in alive:
                try:
                    code, err = await finish(proc)  # what the node said helps tell why the test failed
                except anyio.ClosedResourceError:  # its stderr was being read when the test failed
                    code, err = await proc.wait(), "(stderr read by the test)"
                print(f"node pid {proc.pid} ended with {code}: {err[-2000:]}")
        raise


async def test_external_nodes_join_from_the_node_entry_point_and_leave_when_closed() -> None:
    fns = [partial(CountingEnv, 1, episode_length=5, first_index=i * 10) for i in range(2)]
    with anyio.fail_after(90), held_port("127.0.0.1") as port:
        # Nodes may start before the trainer: they wait for its store to come up.
        nodes = [await run_node(port, r, f"127.0.0.{r + 1}", WORLD_SIZE="3") for r in (1, 2)]
        async with killed_on_failure(nodes):
            async with DistributedCollector(
                fns, scripted(), frames_per_batch=20, total_frames=60, sync=True, launcher="external", tcp_port=port
            ) as c:
                assert c._transport.store_port == port
                batches = [b async for b in c]
                hosts = sorted(str(p).split(" on ")[1] for p in c._worker_pids())
            results = [await finish(p) for p in nodes]
    assert [r[0] for r in results] == [0, 0], [r[1] for r in results]
    assert len(batches) == 3 and all(b.shape == torch.Size([2, 1, 10]) for b in batches)
    assert all(b[WORKER_ID][n].unique().tolist() == [n] for b in batches for n in range(2))
    assert all((b["observation"][1, ..., 0] == 10).all() for b in batches)
    assert [h.split(" (")[1].split(")")[0] for h in hosts] == ["127.0.0.2", "127.0.0.3"]


async def test_misconfigured_external_nodes_are_turned_away_with_the_reason() -> None:
    with anyio.fail_after(90), held_port("127.0.0.1") as port:
        nodes = [await run_node(port, 1, "127.0.0.2")]
        async with killed_on_failure(nodes):
            async with DistributedSyncCollector(
                [partial(CountingEnv, 1)], scripted(), frames_per_batch=4, launcher="external", tcp_port=port
            ) as c:
                await c.__anext__()
                nodes.append(await run_node(port, 2, "127.0.0.3"))  # out of range: one node
                nodes.append(await run_node(port, 1, "127.0.0.4", WORLD_SIZE="4"))  # torchrun-style size mismatch
                nodes.append(await run_node(port, 1, "127.0.0.5"))  # rank 1 is running
                rejected = [await finish(p) for p in nodes[1:]]
                await c.__anext__()  # the running node was not disturbed
            code, err = await finish(nodes[0])
    assert code == 0, err
    assert [r[0] for r in rejected] == [1, 1, 1]
    assert "RANK=2 is out of range: this collector has 1 nodes, ranks 1 to 1" in rejected[0][1]
    assert "WORLD_SIZE=4 does not match this collector: 1 nodes and the trainer make 2" in rejected[1][1]
    assert "RANK=1 is already running as pid" in rejected[2][1] and "(127.0.0.2)" in rejected[2][1]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "1"}, "set MASTER_ADDR, MASTER_PORT"),
        ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "x", "RANK": "1"}, "MASTER_PORT must be an integer, got 'x'"),
        (
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "RANK": "0"},
            "RANK must be 1 or more (rank 0 is the trainer)",
        ),
    ],
)
def test_the_node_entry_point_explains_missing_or_bad_variables(env: dict[str, str], message: str) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    clean["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-m", "aiocollect.node"], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and message in out.stderr, out.stderr


async def test_submitit_local_executor_runs_nodes_and_cleans_up(tmp_path: Path) -> None:
    pytest.importorskip("submitit")
    with anyio.fail_after(100):
        async with DistributedCollector(
            [partial(CountingEnv, 1)] * 2,
            scripted(),
            frames_per_batch=8,
            total_frames=32,
            sync=False,
            launcher="submitit",
            submitit_folder=str(tmp_path),
            shutdown_timeout=10.0,
        ) as c:
            frames = sum([b.numel() async for b in c])
    assert frames == 32
    written = [p async for p in anyio.Path(tmp_path).iterdir()]
    assert written, "submitit wrote no job folder: the launcher did not go through it"


def test_a_submitit_job_deaf_to_its_cancel_is_killed_with_its_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # submitit cancels a local job with SIGINT. A job started with SIGINT ignored (as every
    # process of a CI script's background job is) never acts on it; killing only its
    # controller used to orphan the task process, which then ran on unseen.
    pytest.importorskip("submitit")
    monkeypatch.setattr(_launch, "LOCAL_EXIT_GRACE", 0.5)
    ready = tmp_path / "task-started"
    code = f"import pathlib, threading; pathlib.Path({str(ready)!r}).touch(); threading.Event().wait()"
    executor = _launch.submitit_executor(str(tmp_path), {"timeout_min": 5})
    with orphans_reparented_here():
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the controller and its task
        try:
            job = executor.submit(exec, code)
        finally:
            signal.signal(signal.SIGINT, previous)
        deadline = time.monotonic() + 60
        while not ready.exists():  # the task's own word that it runs: no event crosses processes here
            assert time.monotonic() < deadline, "the submitit task never started"
            time.sleep(0.05)
        tree = [psutil.Process(job._process.pid), *psutil.Process(job._process.pid).children(recursive=True)]
        assert len(tree) >= 2, "expected the controller and its task"
        _launch.cancel_job(job)
        _launch.end_job(job, 0.0)
        _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, f"left running after end_job: {[p.cmdline() for p in alive]}"


async def test_torchrun_job_with_the_trainer_as_rank_0_uses_the_agents_store(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env["TMPDIR"] = str(tmp_path)  # torchrun's log folders go where the test's files go
    for key in ("RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(key, None)
    with anyio.fail_after(100), held_port("127.0.0.1") as port:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
            "--master-port", str(port), str(Path(__file__).parent / "_torchrun_job.py"), str(out),
        ]  # fmt: skip
        done = await anyio.run_process(cmd, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    seen = json.loads(out.read_text())
    # Ranks 1 and 2 (torchrun's) are nodes 0 and 1: each one's share, in rank order.
    assert seen == {"firsts": [[0.0, 10.0]] * 3, "frames": 60}

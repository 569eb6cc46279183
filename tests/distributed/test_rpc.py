"""RPCCollector on real torch RPC groups (TensorPipe, loopback only), nodes launched with "mp"."""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path

import anyio
import pytest
import torch
from _counting_notifier import CountingNotifier
from _node_envs import (
    check_a_close_failure_on_a_node,
    check_envs_on_nodes,
    check_factory_weights_reach_inner_workers,
    check_update_forms,
    check_weights_reach_factory_policies,
    check_whole_episodes_on_nodes,
    scripted,
)
from _rendezvous import MeetingCountingEnv, met
from _weight_policies import check_updates_back_to_back

from aiocollect import RPCCollector, WorkerCrashedError, WorkerError
from aiocollect._workers import _remote
from aiocollect.testing import CountingEnv, FailingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

WORKER_ID, TRAJ, VERSION = ("collector", "worker_id"), ("collector", "traj_ids"), ("collector", "policy_version")


def counting() -> CountingEnv:
    return CountingEnv(1, episode_length=7)


def kw(**extra: object) -> dict[str, object]:
    return {"launcher": "mp", "shutdown_timeout": 5.0, **extra}


@pytest.fixture(scope="module", autouse=True)
def tensorpipe_process_state() -> None:
    """Form and close two RPC groups before any test's leak snapshot.

    TensorPipe opens process-wide descriptors (its event loops, its shared-memory and
    socket listeners' contexts) the first times a process joins an RPC group and keeps them
    for the life of the process; they are not leaks of the test that happens to run first.
    Every later group must leave the descriptor count where it found it.
    """

    async def one() -> None:
        async with RPCCollector([counting] * 2, frames_per_batch=10, total_frames=10, **kw()) as c:
            async for _ in c:
                pass

    for _ in range(2):
        anyio.run(one)


async def test_a_nodes_start_and_stop_are_not_woken_by_the_other_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    # One task per node waits for its node to be ready, and (at close) to be gone: each must be
    # woken by its own node's events only (see test_node_waits.py).
    monkeypatch.setattr(_remote, "Notifier", CountingNotifier)
    monkeypatch.setattr(CountingNotifier, "waits", [])
    nodes = 3
    with anyio.fail_after(60):
        async with RPCCollector([counting] * nodes, frames_per_batch=7 * nodes, total_frames=14 * nodes, **kw()) as c:
            assert len([b async for b in c]) == 2
    waits = CountingNotifier.waits
    assert sorted(key for key, _, _ in waits) == sorted(list(range(nodes)) * 2), waits  # ready, then gone
    assert CountingNotifier.woken_by_others() == [], waits


@pytest.mark.parametrize(
    ("anyio_backend", "sync"), [("asyncio", True), ("asyncio", False), ("trio", False)], indirect=["anyio_backend"]
)
async def test_two_nodes_deliver_batches_with_global_ids(sync: bool, loopback_only, tmp_path: Path) -> None:
    # Both nodes meet at the first step of their third batch. A node collects into two
    # slots, so it starts a third batch only once the trainer has taken its first: four
    # batches at most come before the meeting, and the fifth needs both nodes past it.
    # (Meeting at the second batch only says each node finished its first; one CI run
    # had node 0's first batch still in transit while node 1 delivered all five.)
    meeting = partial(MeetingCountingEnv, str(tmp_path), 2, 41)
    with anyio.fail_after(60):
        async with RPCCollector(
            [meeting] * 2, scripted(), frames_per_batch=20, total_frames=100, sync=sync, **kw()
        ) as c:
            batches = [b async for b in c]
    assert c.stats().frames == 100
    assert met(tmp_path) == 2  # both nodes met
    if sync:
        assert all(b.shape == torch.Size([2, 1, 10]) for b in batches)
        assert all(b[WORKER_ID][i].eq(i).all() for b in batches for i in range(2))
    else:
        assert all(b.shape == torch.Size([1, 20]) for b in batches)
        assert {int(b[WORKER_ID].unique()) for b in batches} == {0, 1}
    owners: dict[int, set[int]] = {}
    for b in batches:
        for t, w in zip(b[TRAJ].flatten().tolist(), b[WORKER_ID].flatten().tolist(), strict=True):
            owners.setdefault(t, set()).add(w)
    assert all(len(ws) == 1 for ws in owners.values())


async def test_weight_updates_are_acknowledged_and_used_by_every_node() -> None:
    policy = scripted(1.0)
    with anyio.fail_after(60):
        async with RPCCollector([counting] * 2, policy, frames_per_batch=20, total_frames=-1, sync=True, **kw()) as c:
            first = await c.__anext__()
            assert (first["action"][first["observation"][..., 2] > 0] == 1).all()
            with torch.no_grad():
                policy.module.weight.fill_(-1.0)
            await c.update_policy_weights_()
            after = await c.__anext__()
    assert (after[VERSION] == 1).all()
    assert (after["action"][after["observation"][..., 2] > 0] == 0).all()


async def test_weights_reach_policies_the_nodes_build_without_a_policy_here() -> None:
    # TorchRL's lazy weight sync (its test_ray_collector_policy_constructor), nodes running.
    await check_weights_reach_factory_policies(RPCCollector, before_start=False, **kw())


async def test_torchrls_update_forms_with_its_own_scheme_reach_the_nodes_they_name() -> None:
    schemes = pytest.importorskip("torchrl.weight_update")  # CI runs a pass without torchrl

    await check_update_forms(RPCCollector, schemes.RPCWeightSyncScheme(), **kw())


async def test_updates_back_to_back_reach_every_node_whole_and_named() -> None:
    # An RPC node queues each update's weights as they arrive, ahead of the command it handles.
    await check_updates_back_to_back(RPCCollector, counting, **kw())


async def test_a_raising_node_is_reported_with_its_rank_and_traceback() -> None:
    with anyio.fail_after(60), pytest.raises(WorkerError) as info:
        async with RPCCollector(
            [counting, partial(FailingEnv, 1, 15)], scripted(), frames_per_batch=10, total_frames=-1, sync=True, **kw()
        ) as c:
            async for _ in c:
                pass
    err = info.value
    assert err.worker_id == 1 and "rank 2" in str(err)
    assert "FailingEnv failed at step 15" in str(err)
    assert isinstance(err.__cause__, ValueError)
    assert "testing.py" in str(err.__cause__.__cause__)


async def test_a_node_whose_env_fails_to_close_raises_it_from_the_close() -> None:
    await check_a_close_failure_on_a_node(RPCCollector, **kw())


async def test_a_killed_node_surfaces_as_worker_crashed_error_within_seconds() -> None:
    with anyio.fail_after(60), pytest.raises(WorkerCrashedError, match="killed by SIGKILL") as info:
        async with RPCCollector([counting] * 2, scripted(), frames_per_batch=10, total_frames=-1, **kw()) as c:
            await c.__anext__()
            os.kill(int(c._worker_pids()[1]), signal.SIGKILL)
            killed = time.monotonic()
            async for _ in c:
                pass
    assert time.monotonic() - killed < 5.0
    assert info.value.worker_id == 1


async def test_one_rpc_collector_at_a_time_and_the_next_one_works() -> None:
    with anyio.fail_after(90):
        async with RPCCollector([counting] * 2, scripted(), frames_per_batch=10, total_frames=-1, **kw()) as c:
            await c.__anext__()
            with pytest.raises(RuntimeError, match="one RPC group per process"):
                async with RPCCollector([counting] * 2, frames_per_batch=10, total_frames=10, **kw()):
                    pass
        # A later collector in the same process forms its own group.
        async with RPCCollector([counting] * 2, scripted(), frames_per_batch=10, total_frames=20, **kw()) as c:
            assert len([b async for b in c]) == 2


async def test_break_stops_every_node_within_the_deadline() -> None:
    with anyio.fail_after(60):
        async with RPCCollector([counting] * 2, scripted(), frames_per_batch=10, total_frames=-1, **kw()) as c:
            async for _ in c:
                break
            start = time.perf_counter()
        closed = time.perf_counter() - start
    assert closed < 2.0, f"shutdown took {closed:.2f}s"


async def test_submitit_local_executor_runs_rpc_nodes(tmp_path) -> None:
    pytest.importorskip("submitit")
    with anyio.fail_after(100):
        async with RPCCollector(
            [partial(CountingEnv, 1, episode_length=7)] * 2, scripted(), frames_per_batch=20, total_frames=60,
            sync=True, launcher="submitit", submitit_folder=str(tmp_path), shutdown_timeout=10.0,
        ) as c:  # fmt: skip
            batches = [b async for b in c]
    assert [b[WORKER_ID][:, 0, 0].tolist() for b in batches] == [[0, 1]] * 3
    assert any(tmp_path.iterdir()), "submitit wrote no job folder: the launcher did not go through it"


def test_bad_arguments_fail_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="backend must be 'gloo'"):
        RPCCollector([counting] * 2, frames_per_batch=10, backend="nccl", launcher="mp")
    with pytest.raises(ValueError, match="launcher must be one of 'mp', 'submitit'"):
        RPCCollector([counting] * 2, frames_per_batch=10, launcher="external")
    with pytest.raises(ValueError, match="tensorpipe_options sets 'rpc_timeout'"):
        RPCCollector([counting] * 2, frames_per_batch=10, launcher="mp", tensorpipe_options={"rpc_timeout": 1})
    with pytest.raises(ValueError, match=r"^remote_configs is only for launcher='ray', got launcher='mp'$"):
        RPCCollector([counting] * 2, frames_per_batch=10, launcher="mp", remote_configs={"num_cpus": 1})
    with pytest.raises(ValueError, match=r"^remote_configs lists 3 dicts for 2 nodes; give one per node$"):
        RPCCollector([counting] * 2, frames_per_batch=10, launcher="ray", remote_configs=[{}] * 3)


@pytest.mark.parametrize("explicit", [False, True], ids=["from_policy", "explicit"])
async def test_updates_reach_the_inner_workers_of_nodes_built_by_a_policy_factory(explicit: bool) -> None:
    await check_factory_weights_reach_inner_workers(RPCCollector, explicit=explicit, **kw())


@pytest.mark.parametrize("kind", ["torchrl", "coroutine"])
async def test_torchrl_and_coroutine_envs_on_nodes(kind: str) -> None:
    await check_envs_on_nodes(RPCCollector, kind, **kw())


async def test_nodes_yield_whole_episodes() -> None:
    await check_whole_episodes_on_nodes(RPCCollector, **kw())  # TorchRL's RPCCollector takes trajs_per_batch too


def test_rpc_visible_devices_is_taken_as_none_and_refused_otherwise() -> None:
    assert RPCCollector([counting] * 2, frames_per_batch=10, visible_devices=None, **kw()) is not None
    with pytest.raises(NotImplementedError, match=r"visible_devices=\['cuda:0', 'cuda:0'\].*backend='nccl'"):
        RPCCollector([counting] * 2, frames_per_batch=10, visible_devices=["cuda:0", "cuda:0"], **kw())

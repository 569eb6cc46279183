"""RayCollector on a real local Ray instance (loopback only), started by this module.

The module starts Ray once (``num_cpus=2``, on 127.0.0.1) and every collector here joins it,
so it must leave Ray running. Ray keeps a pool of idle worker processes and its own system
processes: the leak check of this module ignores those, but fails a test whose actors (or
anything they started) outlive it. `test_ray_lifecycle.py` checks a collector that starts
Ray itself.
"""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path

import anyio
import pytest
import torch

from aiocollect import RayCollector, ReplayBuffer, WorkerCrashedError, WorkerError
from aiocollect.testing import CountingEnv, FailingEnv

ray = pytest.importorskip("ray")
from _leaks import still_running  # noqa: E402
from _node_envs import (  # noqa: E402
    check_a_close_failure_on_a_node,
    check_envs_on_nodes,
    check_factory_weights_reach_inner_workers,
    check_update_forms,
    check_updates_reach_each_node,
    check_weights_reach_factory_policies,
    check_whole_episodes_on_nodes,
    record_call,
    recorded_calls,
    scripted,
)
from _ray_procs import local_ray, no_leaks  # noqa: E402, F401  (the module's Ray and its leak check)
from _rendezvous import MeetingCountingEnv, met  # noqa: E402
from _weight_policies import DeviceEcho, check_updates_back_to_back  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

WORKER_ID, TRAJ, VERSION = ("collector", "worker_id"), ("collector", "traj_ids"), ("collector", "policy_version")
# Half a CPU per actor: two actors and the module's spare capacity fit in num_cpus=2.
ACTOR = {"num_cpus": 0.5, "memory": 256 * 1024**2}


def counting() -> CountingEnv:
    return CountingEnv(1, episode_length=7)


def kw(**extra: object) -> dict[str, object]:
    return {"remote_configs": ACTOR, "shutdown_timeout": 5.0, **extra}


@pytest.mark.parametrize(
    ("anyio_backend", "sync"), [("asyncio", True), ("asyncio", False), ("trio", True)], indirect=["anyio_backend"]
)
async def test_two_actors_deliver_batches_with_global_ids(sync: bool, loopback_only, tmp_path: Path) -> None:
    # Both actors meet at the first step of their third batch. A actor collects into two
    # slots, so it starts a third batch only once the trainer has taken its first: four
    # batches at most come before the meeting, and the fifth needs both actors past it.
    # (Meeting at the second batch only says each actor finished its first; one CI run
    # had node 0's first batch still in transit while node 1 delivered all five.)
    meeting = partial(MeetingCountingEnv, str(tmp_path), 2, 41)
    with anyio.fail_after(120):
        async with RayCollector(
            [meeting] * 2, scripted(), frames_per_batch=20, total_frames=100, sync=sync, **kw()
        ) as c:
            batches = [b async for b in c]
            pids = c._worker_pids()
    assert c.stats().frames == 100
    assert met(tmp_path) == 2  # both actors met
    if sync:
        assert all(b.shape == torch.Size([2, 1, 10]) for b in batches)
        assert all(b[WORKER_ID][i].eq(i).all() for b in batches for i in range(2))
    else:
        assert all(b.shape == torch.Size([1, 20]) for b in batches)
        assert {int(b[WORKER_ID].unique()) for b in batches} == {0, 1}
    # Trajectory ids are unique across actors: no id is used by both.
    owners: dict[int, set[int]] = {}
    for b in batches:
        for t, w in zip(b[TRAJ].flatten().tolist(), b[WORKER_ID].flatten().tolist(), strict=True):
            owners.setdefault(t, set()).add(w)
    assert all(len(ws) == 1 for ws in owners.values())
    assert all(p is not None and p.rank in (1, 2) for p in pids)


async def test_weight_updates_go_through_the_object_store_once_and_are_acknowledged(monkeypatch) -> None:
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value, **k: puts.append(1) or real_put(value, **k))
    policy = scripted(1.0)
    with anyio.fail_after(120):
        async with RayCollector([counting] * 2, policy, frames_per_batch=20, total_frames=-1, sync=True, **kw()) as c:
            first = await c.__anext__()
            assert (first["action"][first["observation"][..., 2] > 0] == 1).all()
            with torch.no_grad():
                policy.module.weight.fill_(-1.0)
            puts.clear()
            await c.update_policy_weights_()
            assert len(puts) == 1, "one ray.put per update, whatever the number of actors"
            after = await c.__anext__()
    assert (after[VERSION] == 1).all()
    assert (after["action"][after["observation"][..., 2] > 0] == 0).all()


async def test_weights_reach_policies_the_nodes_build_without_a_policy_here() -> None:
    # TorchRL's lazy weight sync (its test_ray_collector_policy_constructor), nodes running.
    await check_weights_reach_factory_policies(RayCollector, before_start=False, **kw())


async def test_torchrls_update_forms_with_its_own_scheme_reach_the_nodes_they_name() -> None:
    schemes = pytest.importorskip("torchrl.weight_update")  # CI runs a pass without torchrl

    await check_update_forms(RayCollector, schemes.RayWeightSyncScheme(), **kw())


async def test_async_update_after_each_batch_reaches_the_delivering_actor() -> None:
    with anyio.fail_after(120):
        async with RayCollector(
            [counting] * 2, scripted(), frames_per_batch=10, total_frames=10 * 10, update_after_each_batch=True, **kw()
        ) as c:
            batches = [b async for b in c]
    # An actor's first two batches are collected before it delivers one; its third has the update.
    check_updates_reach_each_node(batches, from_batch=2)
    assert c.stats().policy_version >= 9


async def test_updates_back_to_back_reach_every_actor_whole_and_named() -> None:
    # An actor's host queues each update's weights as they arrive, ahead of the command it
    # handles (the RPC node's code): it must load and name the newest whole version.
    await check_updates_back_to_back(RayCollector, counting, **kw())


# On the host too (AIOCOLLECT_TEST_DEVICE=cpu, as .ci/run does), so that it never rots.
DEVICE = torch.device(os.environ.get("AIOCOLLECT_TEST_DEVICE", "cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")
async def test_actors_sharing_a_gpu_act_on_it_and_load_updates_from_a_host_policy() -> None:
    # Half a GPU per actor: Ray shows each actor the GPU it gave it, "cuda" is that one. The
    # trainer's policy, its weights and the batches stay on the host.
    on_gpu = DEVICE.type == "cuda"
    trainer = DeviceEcho(1.0)
    actor = {**ACTOR, "num_gpus": 0.5 if on_gpu else 0}
    updated, new_workers, batches = False, set(), 0
    with anyio.fail_after(150):
        async with RayCollector(
            [counting] * 2, trainer, frames_per_batch=20, total_frames=-1, sync=True, policy_device=DEVICE,
            remote_configs=actor, shutdown_timeout=5.0,
        ) as c:  # fmt: skip
            async for b in c:
                batches += 1
                assert all(v.device.type == "cpu" for v in b.values(include_nested=True, leaves_only=True))
                assert (b["ran_on"] == (0 if on_gpu else -1)).all(), "every action came from the actor's device"
                new = b[VERSION] >= 1
                sign = torch.where(new, -1.0, 1.0)
                assert torch.equal(b["action"], ((b["observation"].sum(-1) * sign) > 0).long()), "the weights named"
                new_workers |= set(b[WORKER_ID][new].tolist())
                if not updated:
                    with torch.no_grad():
                        trainer.weight.fill_(-1.0)
                    await c.update_policy_weights_()
                    updated = True
                if new_workers == {0, 1} or batches == 40:
                    break
    assert new_workers == {0, 1}, "both actors collected with the update"
    assert next(trainer.parameters()).device.type == "cpu", "the trainer's policy stays where it was"


@pytest.mark.parametrize("anyio_backend", ["trio"], indirect=True)
async def test_a_raising_actor_is_reported_with_its_rank_and_traceback() -> None:
    with anyio.fail_after(120), pytest.raises(WorkerError) as info:
        async with RayCollector(
            [counting, partial(FailingEnv, 1, 15)], scripted(), frames_per_batch=10, total_frames=-1, sync=True, **kw()
        ) as c:
            async for _ in c:
                pass
    err = info.value
    assert err.worker_id == 1 and "rank 2" in str(err)
    assert "FailingEnv failed at step 15" in str(err)
    assert isinstance(err.__cause__, ValueError)
    assert "testing.py" in str(err.__cause__.__cause__)  # the actor's own traceback


async def test_an_actor_whose_env_fails_to_close_raises_it_from_the_close() -> None:
    await check_a_close_failure_on_a_node(RayCollector, **kw())


async def test_a_killed_actor_surfaces_as_worker_crashed_error_within_seconds() -> None:
    with anyio.fail_after(120), pytest.raises(WorkerCrashedError) as info:
        async with RayCollector([counting] * 2, scripted(), frames_per_batch=10, total_frames=-1, **kw()) as c:
            await c.__anext__()
            os.kill(int(c._worker_pids()[1]), signal.SIGKILL)
            killed = time.monotonic()
            async for _ in c:
                pass
    assert time.monotonic() - killed < 5.0
    assert info.value.worker_id == 1


async def test_a_killed_actor_is_replaced_with_the_current_weights() -> None:
    policy = scripted(1.0)
    with anyio.fail_after(120):
        async with RayCollector(
            [counting] * 2, policy, frames_per_batch=10, total_frames=-1, sync=True, restart_nodes=1, **kw()
        ) as c:
            await c.__anext__()
            with torch.no_grad():
                policy.module.weight.fill_(-1.0)
            await c.update_policy_weights_()
            old = int(c._worker_pids()[0])
            os.kill(old, signal.SIGKILL)
            later = [await c.__anext__() for _ in range(3)]
            assert int(c._worker_pids()[0]) != old
    assert c.stats().restarts == 1
    # The replacement collected with version 1 weights from its first batch on.
    assert all((b[VERSION] == 1).all() for b in later)
    assert all((b["action"][b["observation"][..., 2] > 0] == 0).all() for b in later)


async def test_replay_buffer_receives_actor_batches() -> None:
    rb = ReplayBuffer(capacity=1000)
    with anyio.fail_after(120):
        async with RayCollector(
            [counting] * 2, scripted(), frames_per_batch=20, total_frames=80, replay_buffer=rb, **kw()
        ) as c:
            got = [b async for b in c]
    assert got == [None] * 4 and len(rb) == 80


async def test_the_event_loop_keeps_ticking_while_actors_collect() -> None:
    gaps = []
    with anyio.fail_after(120):
        async with RayCollector([counting] * 2, scripted(), frames_per_batch=200, total_frames=4000, **kw()) as c:
            async with anyio.create_task_group() as tg:

                async def heartbeat() -> None:
                    last = time.perf_counter()
                    while True:
                        await anyio.sleep(0.005)
                        now = time.perf_counter()
                        gaps.append(now - last)
                        last = now

                tg.start_soon(heartbeat)
                async for _ in c:
                    pass
                tg.cancel_scope.cancel()
    assert len(gaps) > 10 and max(gaps) < 0.1, f"the loop stalled for {max(gaps) * 1000:.0f} ms"


async def test_break_stops_every_actor_within_the_deadline() -> None:
    with anyio.fail_after(120):
        async with RayCollector([counting] * 2, scripted(), frames_per_batch=10, total_frames=-1, **kw()) as c:
            async for _ in c:
                break
            pids = [int(p) for p in c._worker_pids()]
            start = time.perf_counter()
        closed = time.perf_counter() - start
    assert closed < 2.0, f"shutdown took {closed:.2f}s"
    # An actor may exit while we look (CI once saw one go between pid_exists and status()).
    assert await anyio.to_thread.run_sync(still_running, pids, 5.0) == [], "an actor process outlived the collector"


def test_bad_remote_configs_fail_before_anything_starts() -> None:
    with pytest.raises(ValueError, match=r"^remote_configs \{'num_cpu': 1\} are not valid Ray actor options: Invalid"):
        RayCollector([counting] * 2, frames_per_batch=10, remote_configs={"num_cpu": 1})
    with pytest.raises(ValueError, match=r"^remote_configs sets 'max_restarts'.*; pass restart_nodes= to restart"):
        RayCollector([counting] * 2, frames_per_batch=10, remote_configs={"max_restarts": 3})
    with pytest.raises(ValueError, match=r"^remote_configs lists 3 dicts for 2 nodes; give one per node$"):
        RayCollector([counting] * 2, frames_per_batch=10, remote_configs=[ACTOR] * 3)


async def test_an_actor_ray_cannot_place_is_a_timeout_that_names_the_resources() -> None:
    with anyio.fail_after(60), pytest.raises(TimeoutError, match=r"Ray found no room for remote_configs") as info:
        async with RayCollector([counting] * 2, frames_per_batch=10, total_frames=20, join_timeout=2.0,
                                remote_configs={"num_cpus": 64}) as c:  # fmt: skip
            async for _ in c:
                pass
    assert "'num_cpus': 64" in str(info.value)


@pytest.mark.parametrize("explicit", [False, True], ids=["from_policy", "explicit"])
async def test_updates_reach_the_inner_workers_of_nodes_built_by_a_policy_factory(explicit: bool) -> None:
    await check_factory_weights_reach_inner_workers(RayCollector, explicit=explicit, **kw())


@pytest.mark.parametrize("kind", ["torchrl", "coroutine"])
async def test_torchrl_and_coroutine_envs_on_nodes(kind: str) -> None:
    await check_envs_on_nodes(RayCollector, kind, **kw())


async def test_actors_yield_whole_episodes() -> None:
    await check_whole_episodes_on_nodes(RayCollector, **kw())


async def test_torchrls_actor_arguments_reach_each_actors_collector(tmp_path: Path) -> None:
    # TorchRL's RayCollector hands its hooks, trust_policy and no_cuda_sync to each remote collector.
    policy = scripted()
    with anyio.fail_after(120):
        async with RayCollector(
            [counting] * 2, policy, frames_per_batch=20, total_frames=80, sync=True, trust_policy=True,
            no_cuda_sync=True, pre_collect_hook=partial(record_call, str(tmp_path), "pre"),
            post_collect_hook=partial(record_call, str(tmp_path), "post"), **kw(),
        ) as c:  # fmt: skip
            assert c.num_workers == 2 and c.local_policy() is policy
            assert c.post_collect_hook.args == (str(tmp_path), "post")  # TorchRL's attribute reads it back
            assert all(d["trust_policy"] is True and d["no_cuda_sync"] is True for d in c._dc.node_kwargs)
            batches = [b async for b in c]
            actors = {int(p) for p in c._worker_pids()}
    assert len(batches) == 4
    for kind in ("pre", "post"):
        pids = recorded_calls(tmp_path, kind)
        assert set(pids) == actors, f"the {kind}-collect hook ran in {set(pids)}, not in the actors {actors}"
        assert len(pids) >= 2 * len(batches)  # each actor's collector, once per batch it collected


def test_torchrls_actor_arguments_are_checked_before_ray_starts() -> None:
    with pytest.raises(TypeError, match=r"^post_collect_hook must be a callable \(run by each actor's collector\)"):
        RayCollector([counting] * 2, frames_per_batch=10, post_collect_hook="print")
    with pytest.raises(TypeError, match=r"^trust_policy must be a bool, got 'yes'"):
        RayCollector([counting] * 2, frames_per_batch=10, trust_policy="yes")
    with pytest.raises(TypeError, match=r"^use_env_creator must be a bool, got None"):
        RayCollector([counting] * 2, frames_per_batch=10, use_env_creator=None)
    with pytest.raises(ValueError, match=r"^trust_policy=True contradicts collector_kwargs' trust_policy=False"):
        RayCollector([counting] * 2, frames_per_batch=10, trust_policy=True, collector_kwargs={"trust_policy": False})


async def test_use_env_creator_wraps_torchrl_factories_the_actors_build() -> None:
    envs = pytest.importorskip("torchrl.envs")
    from _node_envs import torchrl_pendulum

    c = RayCollector([torchrl_pendulum] * 2, frames_per_batch=40, total_frames=80, sync=True, use_env_creator=True,
                     **kw())  # fmt: skip
    assert all(isinstance(cfg.create_env_fn, envs.EnvCreator) for cfg in c._mc.worker_cfgs)
    with anyio.fail_after(120):
        async with c:
            batches = [b async for b in c]
    assert [b.numel() for b in batches] == [40, 40]
    assert ("next", "step_count") in batches[0].keys(True, True)


def test_the_blocking_twin_runs_a_torchrl_script_unchanged() -> None:
    # As a TorchRL script writes it: the classic class, a for loop, updates, shutdown().
    from aiocollect import blocking

    policy = scripted()
    collector = blocking.RayCollector(
        [counting] * 2, policy, frames_per_batch=14, total_frames=112, sync=False,
        collector_kwargs={"trajs_per_batch": 2, "traj_format": "cat"}, **kw(),
    )  # fmt: skip
    try:
        assert collector.num_workers == 2 and collector.local_policy() is policy
        batches = []
        for batch in collector:
            batches.append(batch)
            collector.update_policy_weights_()
    finally:
        collector.shutdown()
    assert batches and all(b.shape == (14,) and int(b["next", "done"].sum()) == 2 for b in batches)
    # An actor has its first batch (collected at start-up) and its second slot's done before
    # the first update, and the trainer asks for its third just before that update: the
    # weights show from an actor's fourth batch (frame 42) on. Which actor delivers the last
    # batch is up to the actors' speed (a slow-starting one may deliver only its first two),
    # so the check is per actor; one of the two delivered at least half of the 112 frames.
    workers = torch.cat([b[WORKER_ID] for b in batches])
    versions = torch.cat([b[VERSION] for b in batches])
    for w in workers.unique().tolist():
        mine = versions[workers == w]
        assert (mine[1:] >= mine[:-1]).all(), f"actor {w}'s versions go back: {mine.tolist()}"
        assert (mine[42:] >= 1).all(), f"actor {w}'s fourth and later batches hold the updates: {mine.tolist()}"
    assert int(versions.max()) >= 1, "the updates reached the actors"

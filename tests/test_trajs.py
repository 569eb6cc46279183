"""Complete-trajectory mode (trajs_per_batch) and step-by-step buffer writes (extend_buffer=False)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDictBase

from aiocollect import Collector, MultiSyncCollector, ReplayBuffer, SharedMemoryStorage
from aiocollect.testing import CountingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def env() -> CountingEnv:
    return CountingEnv(2, episode_length=[3, 5])  # env 0: episodes of 3 steps, env 1: of 5


def episodes(obs: torch.Tensor) -> list[tuple[int, int, int]]:
    """(env, episode, length) of each trajectory in a [N, L, 3] padded or [sum L, 3] flat batch."""
    rows = obs.reshape(-1, 3)
    out: list[tuple[int, int, int]] = []
    for env_id, ep, step in rows.long().tolist():
        if step == 0:
            out.append((env_id, ep, 1))
        else:
            e, p, n = out[-1]
            assert (e, p, n) == (env_id, ep, step)  # steps are consecutive within a trajectory
            out[-1] = (e, p, n + 1)
    return out


async def test_padded_batches_hold_whole_episodes_in_completion_order() -> None:
    async with Collector(env, frames_per_batch=8, total_frames=96, trajs_per_batch=3) as c:
        batches = [b async for b in c]
    first = batches[0]
    assert first.shape[0] == 3 and first.names == [None, "time"]
    mask = first["collector", "mask"]
    assert mask.sum(-1).tolist() == [3, 5, 3]
    assert (first["observation"][~mask] == 0).all()  # padding is zeros
    trajs = [t for b in batches for t in episodes(b["observation"][b["collector", "mask"]])]
    # env 0 finishes at steps 3, 6, 9...; env 1 at 5, 10...: completion order interleaves them
    assert trajs[:5] == [(0, 0, 3), (1, 0, 5), (0, 1, 3), (0, 2, 3), (1, 1, 5)]
    assert all(n == (3 if e == 0 else 5) for e, _, n in trajs)  # no partial episode is ever emitted
    ids = torch.cat([b["collector", "traj_ids"][b["collector", "mask"]] for b in batches])
    assert ids.unique().numel() == len(trajs)


async def test_cat_format_is_flat_and_contiguous() -> None:
    async with Collector(env, frames_per_batch=8, total_frames=40, trajs_per_batch=2, traj_format="cat") as c:
        batch = await c.__anext__()
    assert batch.batch_dims == 1 and batch.shape[0] == 3 + 5
    assert episodes(batch["observation"]) == [(0, 0, 3), (1, 0, 5)]


async def test_budget_ending_mid_batch_stops_iteration() -> None:
    async with Collector(env, frames_per_batch=8, total_frames=16, trajs_per_batch=10) as c:
        assert [b async for b in c] == []  # 16 frames never make 10 whole episodes
        assert c.stats().frames == 16


async def test_with_a_buffer_only_complete_episodes_are_written() -> None:
    rb = ReplayBuffer(1000)
    async with Collector(env, frames_per_batch=8, total_frames=40, trajs_per_batch=1, trajs_per_write=2,
                         replay_buffer=rb) as c:  # fmt: skip
        items = [b async for b in c]
    assert items == [None] * 5
    written = episodes(rb.storage.tensors["observation"][: rb.write_count])
    # 20 steps per env: env 0 ends episodes at steps 2, 5, ..., 17 and env 1 at 4, 9, 14, 19;
    # ties go to the lower env row. The unfinished tail of env 0 is never written.
    order = [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1), (0, 3), (0, 4), (1, 2), (0, 5), (1, 3)]
    assert written == [(e, ep, 3 if e == 0 else 5) for e, ep in order]
    assert rb.stats().write_count == 6 * 3 + 4 * 5


async def test_reset_drops_partial_and_queued_trajectories() -> None:
    async with Collector(env, frames_per_batch=8, total_frames=400, trajs_per_batch=2) as c:
        await c.__anext__()
        c.reset()
        assert not c._traj._partial and not c._traj._done
        batch = await c.__anext__()
    assert episodes(batch["observation"][batch["collector", "mask"]])[0][2] in (3, 5)  # whole episodes only


@pytest.mark.parametrize("track_traj_ids", [True, False], ids=["traj_ids", "no_traj_ids"])
async def test_episodes_abandoned_by_reset_at_each_iter_are_dropped(track_traj_ids: bool) -> None:
    # They were joined to the next batch's episode of the same env: 11 of 12 rows held two.
    async with Collector(env, frames_per_batch=8, total_frames=64, trajs_per_batch=2, reset_at_each_iter=True,
                         track_traj_ids=track_traj_ids) as c:  # fmt: skip
        batches = [b async for b in c]
    trajs = [t for b in batches for t in episodes(b["observation"][b["collector", "mask"]])]
    # Each batch steps both envs 4 times from a reset: env 0 finishes one 3-step episode and
    # starts the next (abandoned at the reset); env 1's 5-step episodes never finish.
    assert trajs == [(0, 2 * k, 3) for k in range(8)]
    assert all(bool(b["next", "done"][b["collector", "mask"]].sum() == 2) for b in batches)


async def test_a_postproc_that_flattens_the_batch_still_gets_whole_episodes() -> None:
    # SAC's recipes flatten each batch in postproc; the episodes were cut across envs then.
    def flatten(td: TensorDictBase) -> TensorDictBase:
        return td.reshape(-1)

    async def trajectories(**kw: object) -> list[tuple[int, int, int]]:
        async with Collector(env, frames_per_batch=8, total_frames=96, trajs_per_batch=2, traj_format="cat",
                             **kw) as c:  # fmt: skip
            return [t for b in [b async for b in c] for t in episodes(b["observation"])]

    flat = await trajectories(postproc=flatten)
    assert all(n == (3 if e == 0 else 5) for e, _, n in flat)  # whole episodes of one env each
    assert sorted(flat) == sorted(await trajectories())  # the same episodes as without postproc
    with pytest.raises(ValueError, match=r"no time dim and no \('collector', 'traj_ids'\) to group its frames by"):
        await trajectories(postproc=flatten, track_traj_ids=False)


async def test_a_new_trajectory_id_without_a_done_drops_the_open_episode() -> None:
    # What a restarted worker or a reset() shows: the env's next frames belong to a new episode.
    from tensordict import TensorDict

    from aiocollect._collect._trajs import TrajectoryAssembler

    def frames(ids: list[int], steps: list[int], done: list[bool]) -> TensorDict:
        td = TensorDict(
            {"observation": torch.tensor([[0.0, i, s] for i, s in zip(ids, steps, strict=True)]),
             ("next", "done"): torch.tensor(done).unsqueeze(-1),
             ("collector", "traj_ids"): torch.tensor(ids)},
            batch_size=[len(ids)],
        )  # fmt: skip
        return td.unsqueeze(0)  # one env row

    asm = TrajectoryAssembler(1, "cat", None)
    asm.add(frames([7, 7, 8, 8], [0, 1, 0, 1], [False, False, False, False]))  # 7 abandoned mid-batch
    asm.add(frames([9, 9, 9], [0, 1, 2], [False, False, True]))  # 8 abandoned between batches
    assert asm.ready()
    assert episodes(asm.pop()["observation"]) == [(0, 9, 3)]
    assert not asm.ready() and not asm._partial


async def test_extend_buffer_false_writes_step_by_step() -> None:
    rb = ReplayBuffer(1000)
    async with Collector(env, frames_per_batch=8, total_frames=16, replay_buffer=rb, extend_buffer=False) as c:
        _ = [b async for b in c]
    obs = rb.storage.tensors["observation"][:16]
    assert obs[:, 0].tolist() == [0, 1] * 8  # time-major: both envs' step t, then step t + 1
    assert obs[0::2, 2].tolist() == [0, 1, 2, 0, 1, 2, 0, 1]


async def test_trajectory_arguments_are_checked_before_anything_starts() -> None:
    cases = [
        ({"traj_format": "cat"}, ValueError, r"^traj_format and trajs_per_write need trajs_per_batch"),
        ({"trajs_per_batch": 0}, ValueError, r"^trajs_per_batch must be a positive int or None, got 0$"),
        ({"trajs_per_batch": 2, "traj_format": "flat"}, ValueError, r"^traj_format must be 'padded' or 'cat'"),
        ({"trajs_per_batch": 2, "replay_buffer": ReplayBuffer(10, storage=SharedMemoryStorage(ndim=2))},
         ValueError, r"^trajs_per_batch writes episodes as flat runs of frames; give the replay buffer ndim=1"),
        ({"extend_buffer": False, "replay_buffer": ReplayBuffer(10), "postproc": lambda td: td},
         ValueError, r"^extend_buffer=False writes frames into the buffer step by step"),
        ({"extend_buffer": 1}, TypeError, r"^extend_buffer must be a bool, got 1$"),
        # split_trajs' padded rows once went into the "whole" episodes (padding frames included).
        ({"trajs_per_batch": 2, "split_trajs": True}, ValueError,
         r"^split_trajs=True and trajs_per_batch both cut batches into trajectories.*; drop split_trajs"),
    ]  # fmt: skip
    for kwargs, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            Collector(env, frames_per_batch=8, **kwargs)
    with pytest.raises(ValueError, match=r"^split_trajs=True and trajs_per_batch"):
        MultiSyncCollector([env, env], frames_per_batch=8, trajs_per_batch=2, split_trajs=True)

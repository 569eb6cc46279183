"""Rollout semantics of the collector over gymnasium envs.

Every test drives `StepEnv`, a tiny env whose observation spells out where it is:
``[env_id, episode, step]``. That makes each recorded frame self-describing, so the tests
can check, frame by frame, that

* every frame is a real transition (``next`` step == step + 1, same episode, the env's
  real reward, which also encodes the action that was sent);
* a terminal frame holds the terminal observation and the next frame of that env row starts
  from a fresh reset (step 0, the *next* episode: no skipped or phantom resets);
* trajectory ids change exactly at episode boundaries and never repeat;
* batches continue each other, and ``max_frames_per_traj``, ``set_truncated`` and
  ``reset_at_each_iter`` do what they say.

It runs for a single ``gymnasium.Env`` and for a ``SyncVectorEnv`` in every autoreset mode
(NEXT_STEP, SAME_STEP, DISABLED). The env also counts its ``step`` and ``reset`` calls so
the tests can prove the collector never steps or resets behind the batch's back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from aiocollect import Collector, SyncDataCollector

AR = gym.vector.AutoresetMode
ENV, EP, STEP = 0, 1, 2  # positions in StepEnv's observation


class StepEnv(gym.Env[np.ndarray, int]):
    """Observation ``[env_id, episode, step]``; terminates after ``length`` steps.

    ``length`` may be a tuple: episode ``e`` then lasts ``length[e % len(length)]`` steps.

    ``truncate_at`` (optional) truncates the episode at that step instead. The reward is
    ``10 * step + action``, so a frame's reward proves which action reached the env. The env
    refuses to be stepped after its episode ended and before a reset.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(self, length: int | tuple[int, ...] = 3, env_id: int = 0, truncate_at: int | None = None) -> None:
        self.observation_space = spaces.Box(0.0, 1e6, (3,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.length, self.env_id, self.truncate_at = length, env_id, truncate_at
        self.episode, self.t = -1, 0
        self.finished = True
        self.steps = 0  # step() calls
        self.resets = 0  # reset() calls
        self.seeds: list[int | None] = []
        self.closed = False

    def length_of(self, episode: int) -> int:
        lengths = self.length if isinstance(self.length, tuple) else (self.length,)
        return lengths[episode % len(lengths)]

    def _obs(self) -> np.ndarray:
        return np.array([self.env_id, self.episode, self.t], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.seeds.append(seed)
        self.episode += 1
        self.t = 0
        self.finished = False
        self.resets += 1
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert not self.finished, f"env {self.env_id} stepped after its episode ended, without a reset"
        assert self.action_space.contains(action), f"invalid action {action!r}"
        self.t += 1
        self.steps += 1
        terminated = self.t >= self.length_of(self.episode)
        truncated = self.truncate_at is not None and self.t >= self.truncate_at
        self.finished = terminated or truncated
        return self._obs(), float(10 * self.t + int(action)), terminated, truncated, {}

    def close(self) -> None:
        self.closed = True


@dataclass
class Setup:
    """Builds a fresh env per collector and remembers its `StepEnv`s (one per batch row)."""

    name: str
    mode: AR | None  # None: a single gymnasium.Env
    lengths: tuple[int | tuple[int, ...], ...]
    truncate_at: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        self.envs: list[StepEnv] = []
        if self.mode is None:
            assert len(self.lengths) == 1

    def with_lengths(self, *lengths: int, truncate_at: tuple[int | None, ...] | None = None) -> Setup:
        n = len(self.lengths) if self.mode is not None else 1
        assert len(lengths) == n
        return Setup(self.name, self.mode, tuple(lengths), truncate_at)

    def __call__(self) -> gym.Env[Any, Any] | gym.vector.VectorEnv:
        trunc = self.truncate_at or (None,) * len(self.lengths)
        self.envs = [StepEnv(k, i, tr) for i, (k, tr) in enumerate(zip(self.lengths, trunc, strict=True))]
        if self.mode is None:
            return self.envs[0]
        return gym.vector.SyncVectorEnv([(lambda e=e: e) for e in self.envs], autoreset_mode=self.mode)

    @property
    def n_rows(self) -> int:
        return len(self.lengths)


def _setups(single: tuple[int, ...], vector: tuple[int, ...]) -> list[Any]:
    return [
        pytest.param(Setup("single", None, single), id="single"),
        pytest.param(Setup("next_step", AR.NEXT_STEP, vector), id="next_step"),
        pytest.param(Setup("same_step", AR.SAME_STEP, vector), id="same_step"),
        pytest.param(Setup("disabled", AR.DISABLED, vector), id="disabled"),
    ]


def _setup_kinds() -> list[Any]:
    return [
        pytest.param(None, id="single"),
        pytest.param(AR.NEXT_STEP, id="next_step"),
        pytest.param(AR.SAME_STEP, id="same_step"),
        pytest.param(AR.DISABLED, id="disabled"),
    ]


def make_setup(
    mode: AR | None,
    vector_lengths: tuple[int | tuple[int, ...], ...],
    single_length: int | tuple[int, ...],
    truncate_at: tuple[int | None, ...] | None = None,
    single_truncate_at: int | None = None,
) -> Setup:
    if mode is None:
        return Setup(
            "single",
            None,
            (single_length,),
            None if single_truncate_at is None else (single_truncate_at,),
        )
    return Setup(str(mode), mode, vector_lengths, truncate_at)


def collect(create_env_fn: Callable[[], Any], **kwargs: Any) -> list[TensorDictBase]:
    with SyncDataCollector(create_env_fn, **kwargs) as c:
        return list(c)


def rows(batches: list[TensorDictBase]) -> dict[Any, torch.Tensor]:
    """Every leaf as ``[n_rows, total_T, ...]``: batches concatenated along time, per env row."""
    out: dict[Any, torch.Tensor] = {}
    for key in batches[0].keys(include_nested=True, leaves_only=True):
        parts = []
        for b in batches:
            v = b.get(key)
            parts.append(v.reshape(-1, b.shape[-1], *v.shape[b.batch_dims :]))
        out[key] = torch.cat(parts, 1)
    return out


def check_rollout(
    batches: list[TensorDictBase],
    setup: Setup,
    *,
    max_steps: int | None = None,
    set_truncated: bool = False,
    reset_each_batch: bool = False,
) -> dict[str, int]:
    """Check every frame of ``batches`` against what `StepEnv` really did; return counts."""
    T = batches[0].shape[-1]
    R = rows(batches)
    obs, nxt = R["observation"], R[("next", "observation")]
    action, reward = R["action"], R[("next", "reward")][..., 0]
    term, trunc, done = (R[("next", k)][..., 0] for k in ("terminated", "truncated", "done"))
    traj = R[("collector", "traj_ids")]
    n_rows, total = obs.shape[:2]
    assert n_rows == setup.n_rows
    for k in ("done", "terminated", "truncated"):
        assert not R[k].any(), f"root {k} must be all False"
    owner: dict[int, tuple[int, int]] = {}
    counts = {
        "episodes_ended": 0,
        "limit_truncations": 0,
        "env_truncations": 0,
        "batch_end_truncations": 0,
    }
    for r in range(n_rows):
        env = setup.envs[r]
        real_dones = 0
        for i in range(total):
            o, n, a = obs[r, i], nxt[r, i], int(action[r, i])
            where = f"row {r} frame {i} (batch {i // T}, t={i % T}): obs={o.tolist()} next={n.tolist()}"
            # (1) a real transition of this env row
            assert int(o[ENV]) == r and int(n[ENV]) == r, where
            assert n[STEP] == o[STEP] + 1 and n[EP] == o[EP], f"phantom frame at {where}"
            assert reward[r, i] == 10 * n[STEP] + a, f"reward is not the env's at {where}"
            env_term = bool(n[STEP] >= env.length_of(int(o[EP])))
            env_trunc = env.truncate_at is not None and bool(n[STEP] >= env.truncate_at)
            limit = max_steps is not None and bool(n[STEP] >= max_steps)
            real_done = env_term or env_trunc or limit
            batch_end = set_truncated and i % T == T - 1
            assert bool(term[r, i]) == env_term, f"terminated wrong at {where}"
            assert bool(trunc[r, i]) == (env_trunc or limit or batch_end), f"truncated wrong at {where}"
            assert bool(done[r, i]) == (real_done or batch_end), f"done wrong at {where}"
            if max_steps is not None:
                assert int(R["step_count"][r, i, 0]) == int(o[STEP]), where
                assert int(R[("next", "step_count")][r, i, 0]) == int(n[STEP]), where
            counts["limit_truncations"] += int(limit and not env_term and not env_trunc)
            counts["env_truncations"] += int(env_trunc)
            counts["batch_end_truncations"] += int(batch_end and not real_done)
            real_dones += int(real_done)
            # (3) one trajectory id per (row, episode), never reused
            tid = int(traj[r, i])
            assert owner.setdefault(tid, (r, int(o[EP]))) == (r, int(o[EP])), f"traj id {tid} reused at {where}"
            if i + 1 == total:
                continue
            o2, tid2 = obs[r, i + 1], int(traj[r, i + 1])
            new_batch_reset = reset_each_batch and (i + 1) % T == 0
            if real_done or new_batch_reset:
                # (2) the next frame starts from a reset observation with a new trajectory id
                assert o2[STEP] == 0, f"frame after {where} is not a reset observation: {o2.tolist()}"
                if new_batch_reset:
                    assert o2[EP] > o[EP], where
                else:
                    assert o2[EP] == o[EP] + 1, f"an episode was skipped or repeated after {where}"
                assert tid2 != tid, f"traj id did not change after {where}"
            else:
                # (4) the trajectory goes on, across batch boundaries too
                assert torch.equal(o2, n), f"obs after {where} is {o2.tolist()}, not the previous next obs"
                assert tid2 == tid, f"traj id changed mid-episode after {where}"
        # The env did exactly the recorded steps, and one reset per started episode.
        assert env.steps == total, f"row {r}: env stepped {env.steps} times for {total} frames"
        if not reset_each_batch:
            assert env.resets == 1 + real_dones, f"row {r}: {env.resets} resets for {real_dones} episode ends"
        counts["episodes_ended"] += real_dones
    counts["trajectories"] = len(owner)
    return counts


# -- (1)-(4): real transitions, terminal frames, traj ids, batch continuity -------------------


TRANSITION_SETUPS = [
    *_setups(single=(3,), vector=(2, 3, 5)),
    pytest.param(Setup("single", None, (4,), (3,)), id="single-env_truncation"),
    pytest.param(Setup("next_step", AR.NEXT_STEP, (4, 3, 6), (2, None, 4)), id="next_step-env_truncation"),
    pytest.param(Setup("same_step", AR.SAME_STEP, (4, 3, 6), (2, None, 4)), id="same_step-env_truncation"),
    pytest.param(Setup("disabled", AR.DISABLED, (4, 3, 6), (2, None, 4)), id="disabled-env_truncation"),
]


@pytest.mark.parametrize("setup", TRANSITION_SETUPS)
def test_every_frame_is_a_real_transition(setup: Setup) -> None:
    fpb = 4 * setup.n_rows
    batches = collect(setup, frames_per_batch=fpb, total_frames=6 * fpb)
    assert len(batches) == 6
    for b in batches:
        expected = (4,) if setup.mode is None else (setup.n_rows, 4)
        assert tuple(b.shape) == expected
        assert b.names[-1] == "time"
    counts = check_rollout(batches, setup)
    # The run must actually have crossed episode ends (and env truncations where configured).
    assert counts["episodes_ended"] >= 4 * setup.n_rows
    if setup.truncate_at is not None:
        assert counts["env_truncations"] > 0
    assert all(env.closed for env in setup.envs)


@pytest.mark.parametrize("setup", _setups(single=(3,), vector=(2, 3, 5)))
def test_terminal_frame_holds_terminal_obs_then_reset(setup: Setup) -> None:
    batches = collect(setup, frames_per_batch=7 * setup.n_rows, total_frames=14 * setup.n_rows)
    R = rows(batches)
    done = R[("next", "done")][..., 0]
    seen = 0
    for r in range(setup.n_rows):
        k = setup.lengths[r]
        for i in torch.nonzero(done[r]).flatten().tolist():
            # terminal obs, not the auto-reset one (SAME_STEP puts the latter in the step result)
            assert R[("next", "observation")][r, i, STEP] == k
            assert bool(R[("next", "terminated")][r, i, 0])
            if i + 1 < done.shape[1]:
                nxt_ep = R[("next", "observation")][r, i, EP] + 1
                assert R["observation"][r, i + 1].tolist() == [r, float(nxt_ep), 0.0]
                seen += 1
    assert seen >= setup.n_rows  # every row went through at least one episode boundary


@pytest.mark.parametrize("setup", _setups(single=(3,), vector=(2, 3, 5)))
def test_traj_ids_follow_episodes_and_are_unique(setup: Setup) -> None:
    fpb = 5 * setup.n_rows
    batches = collect(setup, frames_per_batch=fpb, total_frames=4 * fpb)
    R = rows(batches)
    traj, obs = R[("collector", "traj_ids")], R["observation"]
    # traj id <-> (row, episode) is a bijection over the whole run
    pairs = {(int(t), r, int(e)) for r in range(setup.n_rows) for t, e in zip(traj[r], obs[r, :, EP], strict=True)}
    assert len({p[0] for p in pairs}) == len(pairs) == len({p[1:] for p in pairs})
    # the first batch starts with distinct ids, one per env row
    first = batches[0][("collector", "traj_ids")].reshape(setup.n_rows, -1)[:, 0]
    assert len(set(first.tolist())) == setup.n_rows
    # ids change exactly where the previous frame was done
    done = R[("next", "done")][..., 0]
    changed = traj[:, 1:] != traj[:, :-1]
    assert torch.equal(changed, done[:, :-1])
    check_rollout(batches, setup)


@pytest.mark.parametrize("setup", _setups(single=(5,), vector=(2, 5, 7)))
def test_batches_continue_each_other(setup: Setup) -> None:
    fpb = 3 * setup.n_rows
    batches = collect(setup, frames_per_batch=fpb, total_frames=8 * fpb)
    continued = restarted = 0
    for prev, cur in itertools.pairwise(batches):
        p_next = prev[("next", "observation")].reshape(setup.n_rows, 3, 3)[:, -1]
        p_done = prev[("next", "done")].reshape(setup.n_rows, 3)[:, -1]
        p_traj = prev[("collector", "traj_ids")].reshape(setup.n_rows, 3)[:, -1]
        c_obs = cur["observation"].reshape(setup.n_rows, 3, 3)[:, 0]
        c_traj = cur[("collector", "traj_ids")].reshape(setup.n_rows, 3)[:, 0]
        for r in range(setup.n_rows):
            if p_done[r]:
                assert c_obs[r].tolist() == [r, float(p_next[r, EP] + 1), 0.0]
                assert c_traj[r] != p_traj[r]
                restarted += 1
            else:
                assert torch.equal(c_obs[r], p_next[r])
                assert c_traj[r] == p_traj[r]
                continued += 1
    assert continued > 0 and restarted > 0  # both cases were exercised
    check_rollout(batches, setup)


# -- (5) max_frames_per_traj -------------------------------------------------------------------


@pytest.mark.parametrize("mode", _setup_kinds())
def test_max_frames_per_traj_truncates_and_resets(mode: AR | None) -> None:
    n = 4
    setup = make_setup(mode, (2, 5, 9), single_length=9)
    fpb = 5 * setup.n_rows
    batches = collect(setup, frames_per_batch=fpb, total_frames=4 * fpb, max_frames_per_traj=n)
    for b in batches:
        assert b["step_count"].dtype == torch.int64 and b["step_count"].shape == (*b.shape, 1)
        assert b[("next", "step_count")].shape == (*b.shape, 1)
    R = rows(batches)
    nxt_sc, sc = R[("next", "step_count")][..., 0], R["step_count"][..., 0]
    at_limit = nxt_sc == n
    assert at_limit.any()
    assert R[("next", "truncated")][..., 0][at_limit].all()
    assert R[("next", "done")][..., 0][at_limit].all()
    assert not R[("next", "terminated")][..., 0][at_limit].any()
    assert int(nxt_sc.max()) == n and int(sc.max()) == n - 1
    # step_count restarts at 0 right after the truncation
    follow = at_limit[:, :-1]
    assert (sc[:, 1:][follow] == 0).all()
    assert (R["observation"][:, 1:, STEP][follow] == 0).all()
    counts = check_rollout(batches, setup, max_steps=n)
    assert counts["limit_truncations"] > 0
    if mode is not None:
        # the short row terminates on its own before the limit and is never truncated
        assert not R[("next", "truncated")][0].any()
        assert R[("next", "terminated")][0].any()


@pytest.mark.parametrize("mode", _setup_kinds())
def test_max_frames_per_traj_after_env_termination_of_the_same_row(mode: AR | None) -> None:
    # Row 0 alternates: an episode the env terminates (2 steps), then one the collector
    # truncates (limit 4 < 6) at a step where no sub-env finished on its own. In SAME_STEP
    # mode the adapter must not mistake the earlier gymnasium auto-reset for a current one.
    n = 4
    setup = make_setup(mode, ((2, 6), 100), single_length=(2, 6))
    fpb = 6 * setup.n_rows
    batches = collect(setup, frames_per_batch=fpb, total_frames=3 * fpb, max_frames_per_traj=n)
    counts = check_rollout(batches, setup, max_steps=n)
    R = rows(batches)
    assert R[("next", "terminated")][0].any() and counts["limit_truncations"] >= 3
    # row 0's episodes alternate between 2 and 4 frames
    _, lens = torch.unique_consecutive(R[("collector", "traj_ids")][0], return_counts=True)
    assert lens[:4].tolist() == [2, 4, 2, 4]


# -- (6) set_truncated -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", _setup_kinds())
def test_set_truncated_marks_batch_end_without_reset(mode: AR | None) -> None:
    # row 1 ends at steps 3, 6, 9, 12: once mid-batch and once exactly at a batch end (t=11)
    setup = make_setup(mode, (50, 3, 50), single_length=50)
    T = 4
    batches = collect(
        setup,
        frames_per_batch=T * setup.n_rows,
        total_frames=4 * T * setup.n_rows,
        set_truncated=True,
    )
    for b in batches:
        last = b[("next", "truncated")][..., -1, 0]
        assert last.all() and b[("next", "done")][..., -1, 0].all()
        # only frames at the batch end are forced; the trajectory is not reset there
        assert not b[("next", "truncated")][..., :-1, 0].any()
    for prev, cur in itertools.pairwise(batches):
        p_traj = prev[("collector", "traj_ids")].reshape(setup.n_rows, T)[:, -1]
        c_traj = cur[("collector", "traj_ids")].reshape(setup.n_rows, T)[:, 0]
        p_next = prev[("next", "observation")].reshape(setup.n_rows, T, 3)[:, -1]
        c_obs = cur["observation"].reshape(setup.n_rows, T, 3)[:, 0]
        # the long rows were never really done: same trajectory, same episode, next step
        assert c_traj[0] == p_traj[0] and torch.equal(c_obs[0], p_next[0])
        assert c_obs[0, STEP] > 0
    counts = check_rollout(batches, setup, set_truncated=True)
    assert counts["batch_end_truncations"] > 0
    # the long rows kept one single trajectory over the whole run
    assert setup.envs[0].resets == 1
    assert len(set(rows(batches)[("collector", "traj_ids")][0].tolist())) == 1


# -- (7) reset_at_each_iter --------------------------------------------------------------------


@pytest.mark.parametrize("mode", _setup_kinds())
def test_reset_at_each_iter_starts_every_batch_fresh(mode: AR | None) -> None:
    setup = make_setup(mode, (2, 3, 6), single_length=6)
    T = 4
    batches = collect(
        setup,
        frames_per_batch=T * setup.n_rows,
        total_frames=5 * T * setup.n_rows,
        reset_at_each_iter=True,
    )
    seen: set[int] = set()
    last_episode = torch.full((setup.n_rows,), -1.0)
    for b in batches:
        obs = b["observation"].reshape(setup.n_rows, T, 3)
        traj = b[("collector", "traj_ids")].reshape(setup.n_rows, T)
        assert (obs[:, 0, STEP] == 0).all()
        assert (obs[:, 0, EP] > last_episode).all()
        assert not seen & set(traj[:, 0].tolist()), "a batch started with an old trajectory id"
        seen |= set(traj.flatten().tolist())
        last_episode = obs[:, -1, EP]
    check_rollout(batches, setup, reset_each_batch=True)
    # the long env never finished an episode on its own, so each batch's reset started one
    assert setup.envs[-1].resets >= len(batches)


# -- (8) frames_per_batch rounding ---------------------------------------------------------------


def test_frames_per_batch_rounds_up_to_env_batch() -> None:
    setup = make_setup(AR.NEXT_STEP, (2, 3, 5), single_length=0)
    # 10 frames per batch become 12 (4 steps of 3 envs); the budget counts real frames.
    with SyncDataCollector(setup, frames_per_batch=10, total_frames=20) as c:
        batches = list(c)
        stats = c.stats()
    assert [tuple(b.shape) for b in batches] == [(3, 4), (3, 4)]
    assert stats.frames == 24 and stats.batches == 2 and stats.completed
    check_rollout(batches, setup)


def test_total_frames_not_divisible_warns_and_rounds_up() -> None:
    setup = make_setup(None, (), single_length=3)
    with pytest.warns(
        UserWarning,
        match=r"not divisible by frames_per_batch \(10\); the last batch will take collection to 30 frames$",
    ):
        collector = SyncDataCollector(setup, frames_per_batch=10, total_frames=25)
    with collector as c:
        assert len(c) == 3
        batches = list(c)
        assert c.stats().frames == 30
    assert [tuple(b.shape) for b in batches] == [(10,)] * 3
    assert setup.envs[0].steps == 30
    check_rollout(batches, setup)


# -- (9) set_seed reproducibility ----------------------------------------------------------------


class PoleHeuristic(torch.nn.Module):
    """Push the cart toward where the pole leans: deterministic given the observation."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation[..., 2] + observation[..., 3] > 0).to(torch.int64)


def _cartpole(kind: str) -> Any:
    if kind == "single":
        return "CartPole-v1"
    return lambda: gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")


def _seeded_run(
    seed: int, kind: str, policy: Any = None, init_random_frames: int | None = None
) -> list[TensorDictBase]:
    with SyncDataCollector(
        _cartpole(kind),
        policy,
        frames_per_batch=40,
        total_frames=160,
        init_random_frames=init_random_frames,
    ) as c:
        c.set_seed(seed)
        return list(c)


def _assert_same(a: list[TensorDictBase], b: list[TensorDictBase]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert set(x.keys(True, True)) == set(y.keys(True, True))
        for key in x.keys(True, True):
            assert torch.equal(x.get(key), y.get(key)), f"{key} differs"


@pytest.mark.parametrize("kind", ["single", "vector"])
def test_set_seed_reproduces_random_policy_runs(kind: str) -> None:
    a = _seeded_run(7, kind)
    b = _seeded_run(7, kind)
    _assert_same(a, b)
    assert any(bool(x[("next", "done")].any()) for x in a)  # episodes ended and were reset
    c = _seeded_run(8, kind)
    assert not torch.equal(a[0]["observation"], c[0]["observation"])
    assert not all(torch.equal(x["action"], y["action"]) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("kind", ["single", "vector"])
def test_set_seed_reproduces_init_random_frames_then_policy(kind: str) -> None:
    policy = PoleHeuristic()
    a = _seeded_run(3, kind, policy, init_random_frames=40)
    b = _seeded_run(3, kind, policy, init_random_frames=40)
    _assert_same(a, b)
    # first batch: random actions (they disagree with the policy somewhere); later: the policy
    first = a[0]
    assert not torch.equal(first["action"], policy(first["observation"]))
    for later in a[1:]:
        assert torch.equal(later["action"], policy(later["observation"]))
    c = _seeded_run(4, kind, policy, init_random_frames=40)
    assert not torch.equal(a[0]["observation"], c[0]["observation"])
    assert not torch.equal(a[0]["action"], c[0]["action"])


def test_set_seed_mid_run_restarts_the_same_stream() -> None:
    with SyncDataCollector("CartPole-v1", frames_per_batch=30, total_frames=-1) as c:
        c.set_seed(11)
        first = [next(c), next(c)]
        c.set_seed(11)
        again = [next(c), next(c)]
    for x, y in zip(first, again, strict=True):
        for key in (
            "observation",
            "action",
            ("next", "observation"),
            ("next", "reward"),
            ("next", "done"),
        ):
            assert torch.equal(x.get(key), y.get(key)), f"{key} differs after re-seeding"
    # the re-seeded run starts new trajectories: ids are fresh, not replayed
    old = set(torch.cat([x[("collector", "traj_ids")] for x in first]).tolist())
    assert not old & set(again[0][("collector", "traj_ids")].tolist())


# -- (10) heterogeneous episode lengths ------------------------------------------------------------


@pytest.mark.parametrize("mode", [AR.NEXT_STEP, AR.SAME_STEP, AR.DISABLED], ids=["next_step", "same_step", "disabled"])
def test_sub_envs_with_different_lengths_reset_independently(mode: AR) -> None:
    lengths = (2, 3, 5)
    setup = make_setup(mode, lengths, single_length=0)
    batches = collect(setup, frames_per_batch=3 * 10, total_frames=3 * 30)
    R = rows(batches)
    done, obs, traj = R[("next", "done")][..., 0], R["observation"], R[("collector", "traj_ids")]
    total = done.shape[1]
    for r, k in enumerate(lengths):
        # row r is done exactly every k frames: nobody else's reset touched it
        expected = torch.tensor([(i + 1) % k == 0 for i in range(total)])
        assert torch.equal(done[r], expected), f"row {r} (length {k}) done pattern {done[r].int().tolist()}"
        assert obs[r, :, STEP].tolist() == [float(i % k) for i in range(total)]
        _, lens = torch.unique_consecutive(traj[r], return_counts=True)
        assert (lens[:-1] == k).all()
    check_rollout(batches, setup)


# -- the async collector: same semantics ----------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("mode", _setup_kinds())
async def test_async_collector_records_real_transitions(mode: AR | None) -> None:
    setup = make_setup(mode, (2, 3, 5), single_length=3, truncate_at=(None, 2, None))
    fpb = 4 * setup.n_rows
    batches = []
    async with Collector(setup, frames_per_batch=fpb, total_frames=5 * fpb) as c:
        async for b in c:
            batches.append(b)
    assert len(batches) == 5
    check_rollout(batches, setup)
    assert all(env.closed for env in setup.envs)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", [None, AR.SAME_STEP], ids=["single", "same_step"])
async def test_async_collector_max_frames_and_set_truncated(mode: AR | None) -> None:
    setup = make_setup(mode, (2, 9, 7), single_length=9)
    fpb = 5 * setup.n_rows
    batches = []
    async with Collector(
        setup, frames_per_batch=fpb, total_frames=4 * fpb, max_frames_per_traj=4, set_truncated=True
    ) as c:
        async for b in c:
            batches.append(b)
    counts = check_rollout(batches, setup, max_steps=4, set_truncated=True)
    assert counts["limit_truncations"] > 0 and counts["batch_end_truncations"] > 0


@pytest.mark.anyio
async def test_async_iteration_without_context_manager_closes_env() -> None:
    setup = make_setup(AR.SAME_STEP, (2, 3, 5), single_length=0)
    c = Collector(setup, frames_per_batch=6, total_frames=12)
    batches = [b async for b in c]
    assert len(batches) == 2 and all(env.closed for env in setup.envs)
    check_rollout(batches, setup)


def test_env_seeds_reach_every_sub_env() -> None:
    setup = make_setup(AR.SAME_STEP, (2, 3, 5), single_length=0)
    with SyncDataCollector(setup, frames_per_batch=3, total_frames=6) as c:
        c.set_seed(5)
        list(c)
    first_seeds = [env.seeds[0] for env in setup.envs]
    assert all(isinstance(s, int) for s in first_seeds) and len(set(first_seeds)) == 3
    # later (auto-)resets continue the env's RNG instead of re-seeding it
    assert all(s is None for env in setup.envs for s in env.seeds[1:])
    assert np.mean([len(env.seeds) for env in setup.envs]) > 1

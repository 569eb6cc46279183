"""The rollout's fused step loop (`_rollout/_fused.py`) writes exactly what the general loop writes.

The fused loop serves gymnasium envs with a policy (the common case, and the hot path the
benchmarks measure); the general loop (`Rollout.act` / `_record_fast`) is the reference. Each
case collects the same seeded envs with both and compares every entry of every batch, across
episode ends (gymnasium's SAME_STEP and NEXT_STEP vector autoreset, single envs reset by the
collector), so trajectory ids, resets and carried observations are covered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import TransformObservation
from torch import nn

from aiocollect import SyncDataCollector
from aiocollect._envs import _gym
from aiocollect._rollout import _fused, _rollout

AR = gym.vector.AutoresetMode


class Discrete(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


class Continuous(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(3, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs)) * 2.0


class NeedsGrad(Continuous):
    """Returns an action that needs grad (its forward re-enables it): both loops detach it."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            out = super().forward(obs)
        assert out.requires_grad
        return out


class Int32Actions(Discrete):
    """Int32 action indices: stored as the spec's int64, and converted for the env."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return super().forward(obs).to(torch.int32)


class Walk(nn.Module):
    """A fixed walk on FrozenLake's int observation (a 0-d int64 tensor, not a numpy array)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs * 7 + 1) % 4


class TwoKeys(nn.Module):
    """Reads a Dict observation's two arrays (positional, in the space's key order)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def forward(self, cart: torch.Tensor, pole: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([cart, pole], -1)).argmax(-1)


def _split_cartpole() -> gym.Env:
    """CartPole with a Dict observation: two keys, so the fused loop's one-key path does not apply."""
    half = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    space = gym.spaces.Dict({"cart": half, "pole": half})
    env = gym.make("CartPole-v1")
    return TransformObservation(env, lambda o: {"cart": o[:2], "pole": o[2:]}, space)


def _vec(env_id: str, mode: AR) -> Callable[[], gym.vector.VectorEnv]:
    return lambda: gym.make_vec(env_id, 4, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode})


CASES: dict[str, tuple[Callable[[], Any], type[nn.Module]]] = {
    "cartpole-single": (lambda: gym.make("CartPole-v1"), Discrete),
    "cartpole-vec-same-step": (_vec("CartPole-v1", AR.SAME_STEP), Discrete),
    "cartpole-vec-next-step": (_vec("CartPole-v1", AR.NEXT_STEP), Discrete),
    "pendulum-vec-same-step": (_vec("Pendulum-v1", AR.SAME_STEP), Continuous),
    "pendulum-single": (lambda: gym.make("Pendulum-v1", max_episode_steps=30), Continuous),
    "pendulum-vec-action-needs-grad": (_vec("Pendulum-v1", AR.SAME_STEP), NeedsGrad),
    "cartpole-vec-int32-actions": (_vec("CartPole-v1", AR.SAME_STEP), Int32Actions),
    "frozenlake-single-int-observation": (lambda: gym.make("FrozenLake-v1"), Walk),
    "cartpole-single-two-observation-keys": (_split_cartpole, TwoKeys),
}
# The cases the fused loop runs through its general body (more than one observation key).
GENERAL_BODY = {"cartpole-single-two-observation-keys"}


def _batches(
    make_env: Callable[[], Any], policy: nn.Module, fused: bool, monkeypatch: pytest.MonkeyPatch, one_key: bool = True
) -> list:
    calls = []
    numpy_steps = []
    one_key_batches = []
    run_one_key = _fused._run_one_key

    def counted_one_key(*args: Any) -> int:
        one_key_batches.append(1)
        return run_one_key(*args)

    def gate(r: Any, random: bool) -> bool:
        ok = fused and _fused.fused_ok(r, random)
        calls.append(ok)
        return ok

    def counted(step: Callable[..., Any]) -> Callable[..., Any]:
        def step_numpy(self: Any, action: Any, out: Any) -> Any:
            numpy_steps.append(1)
            return step(self, action, out)

        return step_numpy

    with monkeypatch.context() as m:
        m.setattr(_rollout, "fused_ok", gate)
        m.setattr(_fused, "_run_one_key", counted_one_key)
        for cls in (_gym._GymSingle, _gym._GymVector):
            m.setattr(cls, "_step_numpy", counted(cls._step_numpy))
        with SyncDataCollector(make_env, policy, frames_per_batch=200, total_frames=1000) as c:
            c.set_seed(7)
            batches = [b.clone() for b in c]
    assert calls and all(calls) == fused  # the loop under test really ran, every batch
    # Every case has plain gymnasium spaces: the fused loop takes the adapter's one-call step.
    assert (len(numpy_steps) == sum(b.batch_size[-1] for b in batches)) == fused
    # Which body of the fused loop ran: the one-key one, or the general one.
    assert len(one_key_batches) == (len(calls) if fused and one_key else 0)
    return batches


@pytest.mark.parametrize("case", list(CASES))
def test_the_fused_loop_writes_what_the_general_loop_writes(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make_env, policy_cls = CASES[case]
    torch.manual_seed(0)
    policy = policy_cls()
    fused = _batches(make_env, policy, True, monkeypatch, one_key=case not in GENERAL_BODY)
    general = _batches(make_env, policy, False, monkeypatch)
    assert len(fused) == len(general) == 5
    dones = 0
    for f, g in zip(fused, general, strict=True):
        assert set(f.keys(True, True)) == set(g.keys(True, True))
        for key in g.keys(True, True):
            assert torch.equal(f[key], g[key]), key
        dones += int(g["next", "done"].sum())
    assert dones > 0  # episode ends (and their resets) were compared too


@pytest.mark.parametrize("case", ["cartpole-single", "cartpole-vec-same-step", "cartpole-vec-next-step"])
def test_a_preempted_batch_is_the_same_from_both_loops(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A batch cut short (worker processes' preemption) leaves the fused loop mid-batch: every
    # step up to the cut must hold what the general loop writes, and -1 ids after it.
    make_env, policy_cls = CASES[case]
    torch.manual_seed(0)
    policy = policy_cls()
    cut = 37  # steps before the preemption: several episode ends on every case

    def batch(fused: bool) -> Any:
        with monkeypatch.context() as m:
            m.setattr(_rollout, "fused_ok", lambda r, random: fused and _fused.fused_ok(r, random))
            with SyncDataCollector(make_env, policy, frames_per_batch=200, total_frames=-1) as c:
                c.set_seed(7)
                next(iter(c))
                rollout = c._async._rollout  # internal: a preempted batch, as worker processes take
                steps = iter(range(10**6))
                out = rollout.collect(False, None, lambda: next(steps) >= cut - 1)
                return out.clone()

    fused, general = batch(True), batch(False)
    assert set(fused.keys(True, True)) == set(general.keys(True, True))
    for key in general.keys(True, True):
        assert torch.equal(fused[key], general[key]), key
    ids = general["collector", "traj_ids"]
    assert (ids[..., :cut] >= 0).all() and (ids[..., cut:] == -1).all()
    assert int(general["next", "done"][..., :cut, :].sum()) > 0

"""What the benchmarks measure, shared by every script: the policies, the env factories and the bare loop.

Worker and node processes re-import this module to unpickle the policies and env factories
(every factory is a module-level function, or a ``functools.partial`` of one, so it pickles by
reference), so it imports only the standard library, numpy, torch and gymnasium: nothing a
worker would not load anyway. TorchRL is imported inside the ``trl_*`` factories only.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Generator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.wrappers import TimeLimit
from torch import nn

SAME_STEP = gym.vector.AutoresetMode.SAME_STEP
NEXT_STEP = gym.vector.AutoresetMode.NEXT_STEP
DISABLED = gym.vector.AutoresetMode.DISABLED
HEAVY_WORK = 8000  # iterations of burn() per HeavyEnv step: about 1 ms on a quiet 2-core VM

# --------------------------------------------------------------------------------------------
# Policies: the benchmarks' 64-64 MLP (Linear-Tanh-Linear-Tanh-Linear)
# --------------------------------------------------------------------------------------------


def mlp(n_in: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out))


class DiscretePolicy(nn.Module):
    """obs -> int64 action index (CartPole and the heavy env)."""

    def __init__(self, n_obs: int = 4, n_act: int = 2) -> None:
        super().__init__()
        self.mlp = mlp(n_obs, n_act)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.mlp(observation).argmax(-1)


class ContinuousPolicy(nn.Module):
    """obs -> float32 action in [-2, 2] of shape [..., 1] (Pendulum)."""

    def __init__(self, n_obs: int = 3, n_act: int = 1) -> None:
        super().__init__()
        self.mlp = mlp(n_obs, n_act)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mlp(observation)) * 2.0


def seeded(cls: type[nn.Module], *args: int) -> nn.Module:
    """``cls(*args)`` built after ``torch.manual_seed(0)``: the same weights in every process."""
    torch.manual_seed(0)
    return cls(*args)


# --------------------------------------------------------------------------------------------
# Env factories
# --------------------------------------------------------------------------------------------


def make_vec(env_id: str, n: int, mode: gym.vector.AutoresetMode = SAME_STEP) -> gym.vector.VectorEnv:
    """A gymnasium SyncVectorEnv of ``n`` envs in autoreset ``mode``."""
    return gym.make_vec(env_id, n, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode})


def make_env(env_id: str) -> gym.Env:
    return gym.make(env_id)


CARTPOLE8 = functools.partial(make_vec, "CartPole-v1", 8)  # SAME_STEP: real transitions, no phantom frames


def burn(n: int) -> int:
    """Deterministic pure-Python CPU work (a Lehmer RNG): the same cost in every process."""
    x = 1
    for _ in range(n):
        x = (x * 48271) % 2147483647
    return x


class HeavyEnv(CartPoleEnv):
    """CartPole (4 float32 obs, 2 actions, same dynamics) whose step also burns ``work``
    iterations of pure-Python arithmetic, about 1 ms of CPU for the default ``HEAVY_WORK``.
    The work holds the GIL, like a Python simulator would."""

    def __init__(self, work: int = HEAVY_WORK) -> None:
        super().__init__()
        self.work = work
        self.sink = 0

    def step(self, action: Any) -> Any:
        out = super().step(action)
        self.sink = burn(self.work)
        return out


def heavy_step_ms(work: int, probes: int = 50) -> tuple[float, float]:
    """(median, fastest) milliseconds that one heavy step's ``work`` takes here."""
    times = []
    for _ in range(probes):
        t = time.perf_counter()
        burn(work)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, min(times) * 1e3


def make_heavy(work: int = HEAVY_WORK) -> gym.Env:
    return TimeLimit(HeavyEnv(work), max_episode_steps=500)  # CartPole-v1's limit


class WaitingEnv(CartPoleEnv):
    """CartPole whose step also waits ``wait_ms`` without using the CPU: an env whose simulator
    runs elsewhere (another process, a GPU, a server). Many such workers fit on a few cores."""

    def __init__(self, wait_ms: float = 0.5) -> None:
        super().__init__()
        self.wait_s = wait_ms / 1e3

    def step(self, action: Any) -> Any:
        time.sleep(self.wait_s)
        return super().step(action)


def make_waiting(wait_ms: float = 0.5) -> gym.Env:
    return TimeLimit(WaitingEnv(wait_ms), max_episode_steps=500)


def trl_waiting(wait_ms: float = 0.5) -> Any:
    from torchrl.envs import GymWrapper

    return GymWrapper(make_waiting(wait_ms), categorical_action_encoding=True)


def trl_env(env_id: str) -> Any:
    """TorchRL's ``GymEnv`` of one env, with the int64 action index the policies return."""
    from torchrl.envs import GymEnv

    return GymEnv(env_id, categorical_action_encoding=True)


def trl_vec(env_id: str, n: int) -> Any:
    """TorchRL's fastest in-process vector env: its GymWrapper around the same SyncVectorEnv, in
    AutoresetMode.DISABLED (the mode TorchRL documents as preferred: TorchRL resets the finished
    rows itself, no phantom frames)."""
    from torchrl.envs import GymWrapper

    return GymWrapper(make_vec(env_id, n, DISABLED), categorical_action_encoding=True)


def trl_heavy(work: int = HEAVY_WORK) -> Any:
    from torchrl.envs import GymWrapper

    return GymWrapper(make_heavy(work), categorical_action_encoding=True)


# --------------------------------------------------------------------------------------------
# The bare loop: the reference every collector is compared with
# --------------------------------------------------------------------------------------------

KEYS = ("observation", "action", "next_observation", "reward", "terminated", "truncated", "done")


def bare_loop(
    env_fn: Callable[[], Any],
    policy: nn.Module,
    fpb: int,
    total: int,
    *,
    same_step: bool = True,
    device: str | None = None,
) -> Generator[dict[str, torch.Tensor], None, None]:
    """Yield batches of ``fpb`` real transitions, ``[T, N, ...]`` tensors named by ``KEYS``.

    The tightest honest loop: preallocated torch storage written through its numpy views (no
    torch op and no TensorDict per step), one ``torch.no_grad()`` per batch, ``done`` computed
    once per batch, one copy of the storage per batch. With a SAME_STEP vector env the rows that
    ended get their terminal observation from ``info["final_obs"]`` (the returned obs is already
    the reset obs, the next input). With ``same_step=False`` on a NEXT_STEP vector env whatever
    gymnasium returns is recorded, including the phantom "reset" frame after every episode end:
    cheaper, but not the same data. A single env is reset by hand when it ends.

    ``device``: the policy runs there (a GPU); the observations go to it from pinned host rows
    with ``non_blocking=True`` and the action comes back with ``.cpu()``, the one wait per step
    that stepping the env needs.
    """
    env = env_fn()
    try:
        vec = isinstance(env, gym.vector.VectorEnv)
        if vec:
            lead: tuple[int, ...] = (env.num_envs,)
            obs_space, act_space = env.single_observation_space, env.single_action_space
        else:
            lead = ()
            obs_space, act_space = env.observation_space, env.action_space
        n = lead[0] if lead else 1
        T = math.ceil(fpb / n)
        discrete = isinstance(act_space, gym.spaces.Discrete)
        act_shape, act_dtype = ((), torch.int64) if discrete else (tuple(act_space.shape), torch.float32)
        flags = torch.zeros((T, *lead), dtype=torch.bool)
        buf = {
            "observation": torch.zeros((T, *lead, *obs_space.shape), dtype=torch.float32),
            "action": torch.zeros((T, *lead, *act_shape), dtype=act_dtype),
            "next_observation": torch.zeros((T, *lead, *obs_space.shape), dtype=torch.float32),
            "reward": torch.zeros((T, *lead), dtype=torch.float32),
            "terminated": flags,
            "truncated": torch.zeros_like(flags),
            "done": torch.zeros_like(flags),
        }
        if device is not None and torch.device(device).type == "cuda":
            buf["observation"] = buf["observation"].pin_memory()
        obs, act, nxt, rew, term, trunc = (buf[k].numpy() for k in KEYS[:-1])
        rows = buf["observation"].unbind(0)  # the policy's input views, made once
        o, _ = env.reset()
        frames = 0
        while frames < total:
            with torch.no_grad():
                for t in range(T):
                    obs[t] = o
                    if device is None:
                        a = policy(rows[t]).numpy()
                    else:
                        a = policy(rows[t].to(device, non_blocking=True)).cpu().numpy()
                    act[t] = a
                    if vec:
                        o, r, te, tr, info = env.step(a)
                        nxt[t] = o
                        if same_step and "_final_obs" in info:
                            final = info["final_obs"]
                            for i in np.flatnonzero(info["_final_obs"]):
                                nxt[t, i] = final[i]
                    else:
                        o, r, te, tr, _ = env.step(a.item() if discrete else a)
                        nxt[t] = o
                        if te or tr:
                            o, _ = env.reset()
                    rew[t] = r
                    term[t] = te
                    trunc[t] = tr
            torch.logical_or(buf["terminated"], buf["truncated"], out=buf["done"])
            frames += T * n
            yield {k: v.clone() for k, v in buf.items()}
    finally:
        env.close()

"""Envs for the central-inference tests, importable by env worker processes.

`CountEnv` makes every frame checkable: its observation is ``[env id, step in episode]``,
its reward is the action it was given, and env ``i``'s episodes last ``3 + i`` steps. A
frame lost, duplicated, reordered or paired with another env's action shows.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces


class CountEnv(gym.Env):
    observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, env_id: int, fail_at: int | None = None, gate: Any = None, length: int | None = None) -> None:
        self.env_id, self.fail_at, self.gate = env_id, fail_at, gate
        self.length = 3 + env_id if length is None else length
        self.t = 0
        self.steps = 0
        self.closed = False

    def _obs(self) -> np.ndarray:
        return np.array([self.env_id, self.t], np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.gate is not None:
            self.gate(self.env_id, self.steps)
        self.steps += 1
        if self.fail_at is not None and self.steps >= self.fail_at:
            raise ValueError(f"CountEnv {self.env_id} broke at step {self.steps}")
        self.t += 1
        return self._obs(), float(action), self.t >= self.length, False, {}

    def close(self) -> None:
        self.closed = True


class Parity(torch.nn.Module):
    """A deterministic policy: action = step in episode % 2 (as int64). Records its batch sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.sizes: list[int] = []

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.sizes.append(observation.shape[0])
        return (observation[..., 1] * self.scale.detach()).long() % 2


class AsyncCountEnv:
    """`CountEnv` as a coroutine env (stepped on the event loop)."""

    observation_space = CountEnv.observation_space
    action_space = CountEnv.action_space

    def __init__(self, env_id: int, fail_at: int | None = None, length: int | None = None, gate: Any = None) -> None:
        self._env = CountEnv(env_id, fail_at, length=length)
        self.gate = gate  # awaited as gate(env id, steps so far) before each step

    async def reset(self, *, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        return self._env.reset(seed=seed)

    async def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        import anyio.lowlevel

        await anyio.lowlevel.checkpoint()
        if self.gate is not None:
            await self.gate(self._env.env_id, self._env.steps)
        return self._env.step(action)


class SlowEnvs:
    """A `CountEnv` gate: the envs in ``slow`` take ``seconds`` longer at every ``every``-th step (a lagging shard)."""

    def __init__(self, slow: set[int], seconds: float, every: int = 1) -> None:
        self.slow, self.seconds, self.every = slow, seconds, every

    def lags(self, env_id: int, steps: int) -> bool:
        return env_id in self.slow and steps % self.every == 0

    def __call__(self, env_id: int, steps: int) -> None:
        if self.lags(env_id, steps):
            time.sleep(self.seconds)


class AsyncSlowEnvs(SlowEnvs):
    """`SlowEnvs` for `AsyncCountEnv`, whose gate is awaited."""

    async def __call__(self, env_id: int, steps: int) -> None:  # type: ignore[override]
        import anyio

        if self.lags(env_id, steps):
            await anyio.sleep(self.seconds)


def assert_refused_before_build(error: type[BaseException], match: str, **kwargs: Any) -> None:
    """``AsyncBatchedCollector([make, make], frames_per_batch=10, **kwargs)`` raises ``error``
    (message matching ``match``) before either env factory is called."""
    import pytest

    from aiocollect import AsyncBatchedCollector

    built: list[int] = []

    def make() -> gym.Env:
        built.append(1)
        return CountEnv(0)

    args: dict[str, Any] = {"frames_per_batch": 10, **kwargs}
    with pytest.raises(error, match=match):
        AsyncBatchedCollector(args.pop("create_env_fn", [make, make]), **args)
    assert not built, "nothing is built before the arguments are checked"

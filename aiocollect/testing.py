"""Test kit: small deterministic envs and policies for testing collectors and your own code.

Everything here is cheap, deterministic and dependency-free, so it can run in any test suite.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import anyio
import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from ._envs._base import BatchedEnv
from ._envs._specs import ArraySpec, EnvSpec

__all__ = ("CountingEnv", "FailingEnv", "HangingEnv", "ScriptedPolicy", "SleepyAsyncEnv")


class CountingEnv(BatchedEnv):
    """A batch of envs whose observation encodes ``(env index, episode, step)``.

    Each env ``i`` terminates after ``episode_length[i]`` steps. The observation is a float
    vector ``[i, episode, step]`` and the reward is ``step + 1`` (the step just taken), so a
    test can check from any frame alone which env, episode and step it came from.

    Args:
        num_envs: Batch size; ``0`` makes an unbatched env (batch shape ``()``).
        episode_length: Steps per episode, one int for all envs or one per env.
        first_index: Index of the first env (give each worker its own range so frames
            name the worker too).

    Examples:
        >>> env = CountingEnv(2, episode_length=[2, 3])
        >>> env.reset()["observation"].tolist()
        [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    """

    def __init__(self, num_envs: int = 1, episode_length: int | Sequence[int] = 5, *, first_index: int = 0) -> None:
        shape = torch.Size([num_envs]) if num_envs else torch.Size([])
        n = max(num_envs, 1)
        lengths = [episode_length] * n if isinstance(episode_length, int) else list(episode_length)
        if len(lengths) != n:
            raise ValueError(f"episode_length must have one entry per env ({n}), got {len(lengths)}")
        self.spec = EnvSpec(
            shape,
            observation={"observation": ArraySpec((3,), torch.float32)},
            action={"action": ArraySpec((), torch.int64, kind="discrete", n=2)},
        )
        self.lengths = torch.tensor(lengths).reshape(shape)
        self.index = torch.arange(first_index, first_index + n, dtype=torch.float32).reshape(shape)
        self.episode = torch.full(shape, -1.0)
        self.step_idx = torch.zeros(shape)
        self.closed = False

    def _obs(self) -> TensorDict:
        obs = torch.stack([self.index, self.episode, self.step_idx], -1)
        return TensorDict(observation=obs, batch_size=self.spec.batch_size)

    def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        """Start a new episode in the selected envs."""
        m = torch.ones(self.spec.batch_size, dtype=torch.bool) if mask is None else mask
        self.episode = torch.where(m, self.episode + 1, self.episode)
        self.step_idx = torch.where(m, torch.zeros_like(self.step_idx), self.step_idx)
        return self._obs()

    def step(self, action: TensorDictBase) -> TensorDictBase:
        """Advance every env by one step; the action is ignored."""
        self.step_idx = self.step_idx + 1
        out = self._obs()
        out["reward"] = self.step_idx.clone()
        out["terminated"] = self.step_idx >= self.lengths
        out["truncated"] = torch.zeros(self.spec.batch_size, dtype=torch.bool)
        return out

    def close(self) -> None:
        """Mark the env closed (tests assert on ``closed``)."""
        self.closed = True


class FailingEnv(CountingEnv):
    """A `CountingEnv` that raises ``error`` on its ``fail_at``-th call to `step` (1-based).

    ``fail_at=None`` never fails a step; ``fail_on_close=True`` makes `close` raise ``error`` too
    (a simulator that cannot shut down cleanly).

    Examples:
        >>> env = FailingEnv(fail_at=1)
        >>> _ = env.reset()
        >>> env.step(None)
        Traceback (most recent call last):
        ...
        ValueError: FailingEnv failed at step 1
        >>> FailingEnv(fail_at=None, fail_on_close=True).close()
        Traceback (most recent call last):
        ...
        ValueError: FailingEnv failed to close
    """

    def __init__(
        self,
        num_envs: int = 1,
        fail_at: int | None = 3,
        error: type[Exception] = ValueError,
        fail_on_close: bool = False,
    ) -> None:
        super().__init__(num_envs)
        self.fail_at, self.error, self.calls, self.fail_on_close = fail_at, error, 0, fail_on_close

    def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step, or raise on the configured call."""
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error(f"FailingEnv failed at step {self.calls}")
        return super().step(action)

    def close(self) -> None:
        """Close, or raise if ``fail_on_close``."""
        super().close()
        if self.fail_on_close:
            raise self.error("FailingEnv failed to close")


class HangingEnv(CountingEnv):
    """A `CountingEnv` whose `step` blocks from its ``hang_at``-th call (1-based) until released.

    Stands in for a simulator that deadlocks: test liveness settings (``worker_timeout``)
    and shutdown deadlines with it. `release` lets an in-process test unblock it; in a
    worker process it blocks until the process ends.

    Examples:
        >>> env = HangingEnv(hang_at=2)
        >>> _ = env.reset()
        >>> _ = env.step(None)  # the second call would block
        >>> env.release.set()   # (unblocks it, and every later call)
    """

    def __init__(self, num_envs: int = 1, hang_at: int = 3, episode_length: int = 1000) -> None:
        super().__init__(num_envs, episode_length=episode_length)
        self.hang_at, self.calls = hang_at, 0
        self.release = threading.Event()

    def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step, or block from the configured call on."""
        self.calls += 1
        if self.calls >= self.hang_at:
            self.release.wait()
        return super().step(action)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["release"] = None  # events do not pickle; a fresh one is made on the other side
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, release=threading.Event())


class SleepyAsyncEnv:
    """A single gymnasium-style async env whose steps wait ``delay`` seconds (for `AsyncEnvPool`).

    The observation is ``[steps taken]``; episodes last ``episode_length`` steps.

    Examples:
        >>> import anyio
        >>> env = SleepyAsyncEnv(delay=0.0)
        >>> anyio.run(env.reset)[0].tolist()
        [0.0]
    """

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, delay: float = 0.01, episode_length: int = 20) -> None:
        self.delay, self.episode_length, self.t = delay, episode_length, 0

    async def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Start a new episode."""
        self.t = 0
        return np.zeros(1, np.float32), {}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Wait ``delay`` seconds (as a remote simulator would), then advance."""
        await anyio.sleep(self.delay)
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= self.episode_length, False, {}


class ScriptedPolicy(torch.nn.Module):
    """A deterministic policy with one parameter: action = ``(obs.sum(-1) * weight) > 0``.

    Changing ``weight`` (e.g. through ``update_policy_weights_``) visibly changes actions,
    which makes weight synchronisation testable.

    Examples:
        >>> pol = ScriptedPolicy(weight=1.0)
        >>> pol(torch.tensor([[1.0, 2.0], [-3.0, 0.0]])).tolist()
        [1, 0]
    """

    def __init__(self, weight: float = 1.0) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(float(weight)))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        """Map observations to int64 actions in ``{0, 1}``."""
        return ((observation.sum(-1) * self.weight) > 0).long()

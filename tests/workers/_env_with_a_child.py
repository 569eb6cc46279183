"""An env that starts a process of its own, for the tests of workers' descendants (and their scripts)."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from _grandchild import run_forever

from aiocollect.testing import CountingEnv


def start_child(method: str) -> Any:
    """Start a ``multiprocessing`` child that never ends on its own (`run_forever`) with ``method``."""
    ctx: Any = multiprocessing.get_context(method)
    ready = ctx.Event()
    child = ctx.Process(target=run_forever, args=(ready,), name="env child")
    child.start()
    if not ready.wait(60):
        raise RuntimeError("the env's child did not start within 60 s")
    return child


class EnvWithAChild(CountingEnv):
    """A `CountingEnv` that starts a ``multiprocessing`` child, which its `close` leaves running.

    The child never ends on its own (`run_forever`). ``method`` is the child's start method.
    """

    def __init__(self, method: str = "fork", hang_on_close: bool = False) -> None:
        super().__init__(1, episode_length=10**9)
        self.hang_on_close = hang_on_close
        self.child = start_child(method)

    def close(self) -> None:
        """Leave the child running (a leaky env); block forever with ``hang_on_close``."""
        if self.hang_on_close:
            threading.Event().wait()
        super().close()


def env_with_a_child(method: str = "fork", hang_on_close: bool = False) -> Any:
    """A factory of `EnvWithAChild` (one for each worker)."""
    return lambda: EnvWithAChild(method, hang_on_close)


class GymEnvWithAChild(gym.Env[np.ndarray, int]):
    """One gymnasium env that counts its steps and starts a child (an `AsyncBatchedCollector`'s env).

    Its observation is the step within the episode; the child's pid is written as a file
    name into ``pid_dir``, so that a test sees it from another process. Its `close` leaves
    the child running, as `EnvWithAChild`'s does.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, method: str, pid_dir: str) -> None:
        self.child = start_child(method)
        Path(pid_dir, str(self.child.pid)).touch()
        self.t = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return np.array([self.t], np.float32), 1.0, False, False, {}

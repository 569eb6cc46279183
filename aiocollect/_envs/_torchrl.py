"""TorchRL environments (any ``torchrl.envs.EnvBase``) in aiocollect's collectors.

torchrl is an optional dependency: this module imports it only when a TorchRL env is
actually handed to a collector (`is_torchrl_env` looks in ``sys.modules`` first, so a
process that never imported torchrl never will).

A TorchRL env is not translated into aiocollect's `BatchedEnv` protocol: its batches are
TensorDicts whose structure (nested groups with batch dims of their own, lazily stacked
heterogeneous envs, dynamic shapes, non-tensor entries) only TorchRL's own step semantics
preserve. `TorchRLEnv` holds the env with the transforms the collector's arguments ask for
(TorchRL's, as TorchRL's collector appends them), and `_rollout._torchrl` steps it with
``env.step_and_maybe_reset``, as TorchRL's collector does.
"""

from __future__ import annotations

import math
from typing import Any

from .._core._optional import is_instance_of

__all__ = ["TorchRLEnv", "chained_seed", "is_torchrl_env"]


def is_torchrl_env(obj: Any) -> bool:
    """True if ``obj`` is a ``torchrl.envs.EnvBase`` (never imports torchrl itself)."""
    return is_instance_of(obj, "torchrl.envs", "EnvBase")


def chained_seed(seed: int, steps: int) -> int:
    """``seed`` after ``steps`` links of TorchRL's seed chain (``torchrl._utils.seed_generator``).

    TorchRL's multi-process collectors seed worker ``w`` with what worker ``w - 1``'s
    ``env.set_seed`` returned: one link per env it holds (a ``SerialEnv(k)`` counts ``k``).
    """
    from torchrl._utils import seed_generator

    for _ in range(steps):
        seed = seed_generator(seed)
    return int(seed)


def _has_step_count(env: Any) -> bool:
    for key in env.output_spec.keys(True, True):
        if "step_count" in ((key,) if isinstance(key, str) else key):
            return True
    return False


class TorchRLEnv:
    """A ``torchrl.envs.EnvBase`` and the transforms the collector's arguments add to it.

    Args:
        env: The TorchRL env (``GymEnv``, ``TransformedEnv``, ``SerialEnv``, ``ParallelEnv``, ...).
        max_frames_per_traj: Append ``StepCounter(max_steps=...)`` (TorchRL's rule: an env that
            already has a ``step_count`` entry is refused).
        track_policy_version: ``True`` appends a ``PolicyVersion`` transform; a
            ``PolicyVersion`` instance is appended as given.
        env_device: Move the env there (TorchRL's ``env.to``).

    Raises:
        ValueError: ``max_frames_per_traj`` on an env that already counts steps.
        RuntimeError: ``track_policy_version=True`` on a batched env (as TorchRL).
    """

    #: ``Collector.set_seed(s)`` seeds the env with ``s`` itself (TorchRL's semantics).
    _seeds_as_given = True

    def __init__(
        self,
        env: Any,
        *,
        max_frames_per_traj: int | None = None,
        track_policy_version: Any = False,
        env_device: Any = None,
    ) -> None:
        from torchrl.envs import TransformedEnv

        self.version_tracker: Any = None
        try:
            if env_device is not None:
                env = env.to(env_device)
            if max_frames_per_traj:
                if _has_step_count(env):
                    raise ValueError(
                        "max_frames_per_traj adds a StepCounter, but the env already has a 'step_count' entry (a "
                        "StepCounter of its own); set max_frames_per_traj to None or remove the env's StepCounter"
                    )
                from torchrl.envs import StepCounter

                env = TransformedEnv(env, StepCounter(max_steps=max_frames_per_traj))
            if track_policy_version is not False and track_policy_version is not None:
                env = self._track_versions(env, track_policy_version)
        except BaseException:
            if not env.is_closed:
                env.close()
            raise
        self.env = env
        self.batch_size = tuple(env.batch_size)
        self.numel = math.prod(self.batch_size)

    def _track_versions(self, env: Any, tracker: Any) -> Any:
        from torchrl.envs.batched_envs import BatchedEnvBase
        from torchrl.envs.llm.transforms.policy_version import PolicyVersion

        if tracker is True:
            if isinstance(env, BatchedEnvBase):
                raise RuntimeError(
                    "track_policy_version=True cannot add a PolicyVersion transform to a batched env "
                    f"({type(env).__name__}); append PolicyVersion() to each sub-env and pass that transform"
                )
            tracker = PolicyVersion()
        if not hasattr(tracker, "increment_version"):
            raise TypeError(f"track_policy_version must be a bool or a PolicyVersion transform, got {tracker!r}")
        self.version_tracker = tracker
        return env.append_transform(tracker)

    def set_seed(self, seed: int) -> int:
        """Seed the env as TorchRL does (``env.set_seed``); returns the env's next seed."""
        return int(self.env.set_seed(int(seed)))

    def close(self) -> None:
        """Close the TorchRL env (a ``ParallelEnv`` stops its workers)."""
        if not self.env.is_closed:
            self.env.close()

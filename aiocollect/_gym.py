"""Gymnasium adapters: a single ``gymnasium.Env`` or a ``VectorEnv`` as a `BatchedEnv`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ._envs import BatchedEnv, StepArrays
from ._gym_spaces import flatten_space, to_gym_action, write_obs, write_row
from ._specs import EnvSpec, NestedKey

__all__ = ["wrap_gymnasium"]


def wrap_gymnasium(env: gym.Env[Any, Any] | gym.vector.VectorEnv, *, one_hot: bool = False) -> BatchedEnv:
    """Wrap a gymnasium env or vector env as an aiocollect `BatchedEnv`.

    The collector does this for you when ``create_env_fn`` returns a gymnasium env; call it
    yourself to choose ``one_hot``.

    Args:
        env: A ``gymnasium.Env`` (batch shape ``()``) or a ``gymnasium.vector.VectorEnv``
            (batch shape ``(num_envs,)``) in any autoreset mode.
        one_hot: Encode ``Discrete`` spaces as one-hot vectors instead of int64 indices.

    Returns:
        A `BatchedEnv` whose observation and action keys follow TorchRL's layout.

    Examples:
        >>> import gymnasium as gym
        >>> env = wrap_gymnasium(gym.make("CartPole-v1"))
        >>> env.spec.batch_size, list(env.spec.observation)
        (torch.Size([]), ['observation'])
        >>> env.close()
    """
    if isinstance(env, gym.vector.VectorEnv):
        return _GymVector(env, one_hot)
    if isinstance(env, gym.Env):
        return _GymSingle(env, one_hot)
    raise TypeError(f"wrap_gymnasium needs a gymnasium.Env or gymnasium.vector.VectorEnv, got {type(env).__name__}")


class _GymBase(BatchedEnv):
    def __init__(self, env: Any, obs_space: Any, act_space: Any, batch: torch.Size, one_hot: bool) -> None:
        self.env = env
        self._obs_leaves = flatten_space(obs_space, "observation", one_hot=one_hot)
        self._act_leaves = flatten_space(act_space, "action", one_hot=one_hot)
        self.spec = EnvSpec(
            batch,
            observation={leaf.key: leaf.spec for leaf in self._obs_leaves},
            action={leaf.key: leaf.spec for leaf in self._act_leaves},
        )
        # Preallocated outputs: every step writes into these in place.
        self._obs = {k: s.zeros(tuple(batch)) for k, s in self.spec.observation.items()}
        self._reset_obs = {k: s.zeros(tuple(batch)) for k, s in self.spec.observation.items()}

    def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        """Reset the selected envs; see `BatchedEnv.reset`."""
        out = self._reset_arrays(mask, seeds)
        return TensorDict({k: v.clone() for k, v in out.items()}, batch_size=self.spec.batch_size)

    def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step the envs; see `BatchedEnv.step`."""
        obs, reward, term, trunc = self._step_arrays({k: action.get(k) for k in self.spec.action})
        data = {k: v.clone() for k, v in obs.items()}
        data.update(reward=reward, terminated=term, truncated=trunc)
        return TensorDict(data, batch_size=self.spec.batch_size)

    def close(self) -> None:
        """Close the wrapped gymnasium env."""
        self.env.close()


class _GymSingle(_GymBase):
    def __init__(self, env: gym.Env[Any, Any], one_hot: bool) -> None:
        super().__init__(env, env.observation_space, env.action_space, torch.Size([]), one_hot)

    def _reset_arrays(self, mask: torch.Tensor | None, seeds: Sequence[int] | None) -> dict[NestedKey, torch.Tensor]:
        obs, _ = self.env.reset(seed=None if seeds is None else int(seeds[0]))
        write_obs(self._obs_leaves, obs, self._reset_obs)
        return self._reset_obs

    def _step_arrays(self, action: dict[NestedKey, torch.Tensor], out: Any = None) -> StepArrays:
        obs, reward, term, trunc, _ = self.env.step(to_gym_action(self._act_leaves, action, single=True))
        out = self._obs if out is None else out
        write_obs(self._obs_leaves, obs, out)
        return (
            out,
            torch.tensor(float(reward), dtype=torch.float32),
            torch.tensor(bool(term)),
            torch.tensor(bool(trunc)),
        )


class _GymVector(_GymBase):
    def __init__(self, env: gym.vector.VectorEnv, one_hot: bool) -> None:
        super().__init__(
            env, env.single_observation_space, env.single_action_space, torch.Size([env.num_envs]), one_hot
        )
        mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        self._same_step = gym.vector.AutoresetMode(mode) == gym.vector.AutoresetMode.SAME_STEP
        self._auto_reset = np.zeros(env.num_envs, dtype=np.bool_)

    def _reset_arrays(self, mask: torch.Tensor | None, seeds: Sequence[int] | None) -> dict[NestedKey, torch.Tensor]:
        seed = None if seeds is None else [int(s) for s in seeds]
        if mask is None or (bool(mask.all()) and not self._same_step):
            obs, _ = self.env.reset(seed=seed)
            write_obs(self._obs_leaves, obs, self._reset_obs)
            self._auto_reset[:] = False
            return self._reset_obs
        # In SAME_STEP mode gymnasium already reset the rows that ended during step() and their
        # reset observations were stashed then; only the other rows (ended by the collector's
        # own step limit) need a real reset.
        need = mask.numpy().astype(np.bool_) & ~self._auto_reset
        if need.any():
            obs, _ = self.env.reset(seed=seed, options={"reset_mask": need})
            write_obs(self._obs_leaves, obs, self._reset_obs, rows=need)
        self._auto_reset[:] = False
        return self._reset_obs

    def _step_arrays(self, action: dict[NestedKey, torch.Tensor], out: Any = None) -> StepArrays:
        obs, reward, term, trunc, info = self.env.step(to_gym_action(self._act_leaves, action, single=False))
        out = self._obs if out is None else out  # the collector's own storage: one copy fewer
        write_obs(self._obs_leaves, obs, out)
        term_t = torch.from_numpy(np.asarray(term, dtype=np.bool_))
        trunc_t = torch.from_numpy(np.asarray(trunc, dtype=np.bool_))
        if self._same_step and "_final_obs" in info:
            # gymnasium returned reset observations for finished rows and put the terminal
            # ones in info; the transition must hold the terminal observation.
            # The collector reads reset observations only for those rows, so a plain copy of
            # every row is enough (and cheaper than a masked one).
            self._auto_reset = np.asarray(info["_final_obs"], dtype=np.bool_).copy()
            for k, v in out.items():
                self._reset_obs[k].copy_(v)
            for i in np.flatnonzero(self._auto_reset):
                write_row(self._obs_leaves, info["final_obs"][i], out, int(i))
        return out, torch.from_numpy(np.asarray(reward, dtype=np.float32)), term_t, trunc_t

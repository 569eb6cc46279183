"""`EnvShard`: a group of single gymnasium envs stepped row by row into shared arrays.

Central inference splits what a collector does in one place: the policy runs where the
collector is, on whichever envs are ready, and the envs step elsewhere, in shards (a thread,
or an env-only worker process), each env on its own. A shard exchanges no Python objects
with the collector per step: the collector writes actions into rows of ``act`` and names the
rows to step; the shard writes each env's next observation, reward and flags into the same
rows of ``obs`` and the flag arrays, and, for an env whose episode ended, its first
observation of the next episode into ``reset_obs`` (the env is reset where it steps, so an
episode end costs no extra round trip). The same code runs in a thread and in a process;
the arrays are plain tensors or views of a shared memory block.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .._core._errors import note_once
from .._envs._gym_spaces import Leaf, Source, fast_row_writer, to_gym_action, write_row
from .._envs._specs import NestedKey

__all__ = ["EnvShard", "SlotArrays", "build_env", "is_coroutine_env", "single_env", "slot_layout"]

#: The per-env arrays a shard and the collector share, by name.
SlotArrays = dict[str, dict[NestedKey, torch.Tensor]]


def slot_layout(
    n: int, obs: dict[NestedKey, Any], act: dict[NestedKey, Any]
) -> list[tuple[Any, tuple[int, ...], torch.dtype]]:
    """The ``(key, shape, dtype)`` entries of ``n`` envs' slots (``SharedBlock`` layout)."""
    layout: list[tuple[Any, tuple[int, ...], torch.dtype]] = []
    for group, specs in (("obs", obs), ("reset_obs", obs), ("act", act)):
        layout += [((group, k), (n, *s.shape), s.dtype) for k, s in specs.items()]
    layout += [(("flags", "reward"), (n,), torch.float32)]
    layout += [(("flags", f), (n,), torch.bool) for f in ("terminated", "truncated")]
    return layout


def group_views(views: dict[Any, torch.Tensor]) -> SlotArrays:
    """``{(group, key): tensor}`` as ``{group: {key: tensor}}``."""
    out: SlotArrays = {}
    for (group, key), t in views.items():
        out.setdefault(group, {})[key] = t
    return out


class EnvShard:
    """Steps the envs it holds, reading actions from and writing results to the slot arrays.

    Args:
        envs: ``{env id: gymnasium env}``; ids index the arrays' rows.
        obs_leaves, act_leaves: The envs' flattened observation and action spaces.
        arrays: The slot arrays (see `slot_layout`).
        names: How errors name each env (``"CartPole-v1 (env 3)"``).
    """

    def __init__(
        self,
        envs: dict[int, Any],
        obs_leaves: list[Leaf],
        act_leaves: list[Leaf],
        arrays: SlotArrays,
        names: dict[int, str],
    ) -> None:
        self.envs, self.names = envs, names
        self.obs_leaves, self.act_leaves = obs_leaves, act_leaves
        self.obs, self.reset_obs, self.act = arrays["obs"], arrays["reset_obs"], arrays["act"]
        flags = arrays["flags"]
        self._reward, self._term, self._trunc = (flags[f].numpy() for f in ("reward", "terminated", "truncated"))
        self._act_np = {k: v.numpy() for k, v in self.act.items()}
        single = len(act_leaves) == 1 and act_leaves[0].path == ()
        self._batched_actions = single
        self._discrete = single and act_leaves[0].spec.kind == "discrete"
        self._src = {i: Source(name, "observation_space") for i, name in names.items()}
        self._fast = fast_row_writer(obs_leaves, self.obs), fast_row_writer(obs_leaves, self.reset_obs)

    def reset(self, rows: Sequence[int], seeds: Sequence[int | None] | None = None) -> None:
        """Reset the envs of ``rows`` (optionally seeded); their observations land in ``obs``."""
        for j, i in enumerate(rows):
            seed = None if seeds is None else seeds[j]
            try:
                obs, _ = self.envs[i].reset(seed=seed)
            except Exception as exc:
                note_once(exc, f"raised by env {self.names[i]} in reset()")
                raise
            self._write(self._fast[0], self.obs, i, obs, "reset()")

    def step(self, rows: np.ndarray) -> None:
        """Step each env of ``rows`` with its row of ``act``; reset it where its episode ended."""
        actions = self._actions(rows)
        reward, term, trunc = self._reward, self._term, self._trunc
        write, write_reset = self._fast
        envs = self.envs
        for j, i in enumerate(rows.tolist()):
            env = envs[i]
            try:
                obs, r, te, tr, _ = env.step(actions[j])
                self._write(write, self.obs, i, obs, "step()")
                reward[i], term[i], trunc[i] = r, te, tr
                if te or tr:
                    obs, _ = env.reset()
                    self._write(write_reset, self.reset_obs, i, obs, "reset()")
            except Exception as exc:
                note_once(exc, f"raised by env {self.names[i]} in step()")
                raise

    def close(self) -> None:
        """Close every env (all of them, even if one's ``close`` raises; the first error is raised)."""
        error: BaseException | None = None
        for env in self.envs.values():
            try:
                env.close()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def _actions(self, rows: np.ndarray) -> Sequence[Any]:
        if self._batched_actions:
            batch = to_gym_action(self.act_leaves, {k: v[rows] for k, v in self._act_np.items()}, single=False)
            return batch.tolist() if self._discrete else list(batch)  # fancy indexing made a private copy
        return [to_gym_action(self.act_leaves, {k: v[i] for k, v in self._act_np.items()}, single=True) for i in rows]

    def _write(self, fast: Callable[[int, Any], bool] | None, out: dict[NestedKey, torch.Tensor], i: int,
               obs: Any, method: str) -> None:  # fmt: skip
        if fast is None or not fast(i, obs):
            write_row(self.obs_leaves, obs, out, i, self._src[i], method)


def build_env(fn: Any, kwargs: dict[str, Any]) -> Any:
    """One env from an env id or a factory."""
    if isinstance(fn, str):
        import gymnasium as gym

        return gym.make(fn, **kwargs)
    return fn(**kwargs)


def is_coroutine_env(env: Any) -> bool:
    """A single env whose ``step`` is a coroutine function (an `AsyncEnvPool` env)."""
    return inspect.iscoroutinefunction(getattr(env, "step", None))


def single_env(env: Any, i: int) -> Any:
    """The env factory ``i`` built, as a shard steps it: one gymnasium-style env.

    A TorchRL env (batch size ``[]``) is wrapped as a gymnasium env (`TorchRLSingleEnv`);
    anything else that is not one env is refused with what to do instead.
    """
    import gymnasium as gym

    from .._envs._base import AsyncBatchedEnv, BatchedEnv
    from ._torchrl_env import TorchRLSingleEnv, is_torchrl_env

    if is_torchrl_env(env):
        return TorchRLSingleEnv(env, i)
    if isinstance(env, (gym.vector.VectorEnv, BatchedEnv, AsyncBatchedEnv)):
        raise TypeError(
            f"AsyncBatchedCollector's env factory {i} returned {type(env).__name__}, a batched env; each factory "
            "must return one gymnasium.Env (or one coroutine env): pass one factory per env"
        )
    if is_coroutine_env(env):
        return env
    if not isinstance(env, gym.Env):
        raise TypeError(
            f"AsyncBatchedCollector's env factory {i} returned {type(env).__name__}; it must return a gymnasium.Env, "
            "a TorchRL env or a coroutine env (async reset/step)"
        )
    return env

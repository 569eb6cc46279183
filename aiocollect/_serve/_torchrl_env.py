"""One TorchRL env seen as a gymnasium env, so an `AsyncBatchedCollector` shard can step it.

TorchRL's ``AsyncBatchedCollector`` takes a list of TorchRL env factories; its users pass
``lambda: GymEnv("CartPole-v1")`` or a ``TransformedEnv``. Shards step gymnasium-style envs
row by row (`EnvShard`), so a TorchRL env with batch size ``[]`` is wrapped: its
observation and action specs become gymnasium spaces with the same keys, shapes and dtypes
(so batches keep TorchRL's layout), ``reset``/``step`` go through the env's own ``reset`` and
``step`` with the carried TensorDict (stateless envs read their state from it), and its
reward and done flags come back as gymnasium's five values.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from .._envs._gym_spaces import OneHotDiscrete

__all__ = ["TorchRLSingleEnv", "is_torchrl_env"]


def is_torchrl_env(env: Any) -> bool:
    """A TorchRL ``EnvBase`` (told apart without importing torchrl)."""
    return hasattr(env, "batch_size") and hasattr(env, "rollout") and hasattr(env, "full_done_spec")


class TorchRLSingleEnv(gym.Env):
    """A TorchRL env with batch size ``[]`` as a gymnasium env (see the module docstring).

    Args:
        env: The TorchRL env.
        index: The factory's index, for error messages.

    Raises:
        TypeError: A batched env, or a spec with no gymnasium counterpart.
    """

    def __init__(self, env: Any, index: int) -> None:
        if tuple(env.batch_size) != ():
            raise TypeError(
                f"AsyncBatchedCollector's env factory {index} returned a batched TorchRL env "
                f"({type(env).__name__}, batch size {list(env.batch_size)}); each factory must return one env "
                "(batch size []): pass one factory per env"
            )
        self.env = env
        self.label = type(env).__name__  # how errors name the env
        self.observation_space = _space(env.observation_spec, "observation", index)
        self._action_key = env.action_key
        self._action_dtype = env.action_spec.dtype
        self._device = env.device  # None or a device: actions go where the env's spec says
        self.action_space = _space(env.action_spec, f"action {self._action_key!r}", index)
        space = self.action_space
        self._one_hot = int(space.n) if isinstance(space, OneHotDiscrete) else 0
        self._reward_key = env.reward_key
        done_keys = set(env.full_done_spec.keys(True, True))
        self._term_key = "terminated" if "terminated" in done_keys else "done"
        self._has_trunc = "truncated" in done_keys
        self._obs_keys = list(env.observation_spec.keys(True, True))
        self._td: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self.env.set_seed(int(seed))
        self._td = self.env.reset()
        return self._obs(self._td), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        from torchrl.envs.utils import step_mdp

        td = self._td
        a = torch.as_tensor(action)
        if self._one_hot:  # the index the shard took from the one-hot action, one-hot again
            a = torch.nn.functional.one_hot(a, self._one_hot)
        td.set(self._action_key, a.to(device=self._device, dtype=self._action_dtype))
        out = self.env.step(td)
        nxt = out.get("next")
        obs = self._obs(nxt)
        reward = float(nxt.get(self._reward_key))  # .item() moves a CUDA scalar too
        terminated = bool(nxt.get(self._term_key))
        truncated = bool(nxt.get("truncated")) if self._has_trunc else False
        self._td = step_mdp(out, keep_other=True)
        return obs, reward, terminated, truncated, {}

    def close(self) -> None:
        self.env.close()

    def _obs(self, td: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in self._obs_keys:
            path = (key,) if isinstance(key, str) else key
            node = out
            for name in path[:-1]:
                node = node.setdefault(name, {})
            node[path[-1]] = td.get(key).detach().cpu().numpy()  # no copy for CPU tensors
        return out


def _space(spec: Any, what: str, index: int) -> gym.spaces.Space[Any]:
    """The gymnasium space of a TorchRL spec: same shape and dtype, and a Dict for a Composite."""
    from torchrl.data import Binary, Categorical, Composite, OneHot

    if isinstance(spec, Composite):
        return gym.spaces.Dict({k: _space(spec[k], f"{what} {k!r}", index) for k in spec.keys()})
    dtype = torch.empty((), dtype=spec.dtype).numpy().dtype
    shape = tuple(spec.shape)
    if isinstance(spec, Categorical) and shape == ():
        return gym.spaces.Discrete(int(spec.space.n))
    if isinstance(spec, OneHot) and len(shape) == 1:
        return OneHotDiscrete(int(spec.space.n))  # sampled and stored one-hot, stepped as an index
    if isinstance(spec, (OneHot, Binary)):
        return gym.spaces.Box(0, 1, shape, dtype)
    box = getattr(spec, "space", None)
    low, high = getattr(box, "low", None), getattr(box, "high", None)
    if low is not None and high is not None:
        return gym.spaces.Box(low.cpu().numpy().astype(dtype), high.cpu().numpy().astype(dtype), shape, dtype)
    if type(spec).__name__.startswith("Unbounded"):
        bound = np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).max
        return gym.spaces.Box(-bound, bound, shape, dtype)
    raise TypeError(
        f"AsyncBatchedCollector's env factory {index} returned a TorchRL env whose {what} spec is "
        f"{type(spec).__name__}, which has no gymnasium counterpart here; collect from this env with Collector or "
        "MultiSyncCollector"
    )

"""aiocollect's batched-environment protocol: TensorDict in, TensorDict out, plus specs.

The collector talks to every environment through two private methods, ``_reset_arrays`` and
``_step_arrays``, which exchange plain dicts of tensors. The public ``reset``/``step`` methods
take and return TensorDicts; the base classes translate. Adapters that care about speed (the
gymnasium ones) override the private pair directly and skip the TensorDict round trip.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from ._specs import EnvSpec, NestedKey

__all__ = ["AsyncBatchedEnv", "BatchedEnv", "StepArrays", "StepOut"]

#: (observation dict, reward ``[*B]`` float32, terminated ``[*B]`` bool, truncated ``[*B]`` bool)
StepArrays = tuple[dict[NestedKey, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class StepOut:
    """Where the collector stores one time step: adapters may write their results straight in.

    ``flags`` are the ``[*B]`` reward, terminated, truncated and done slices. The ``*_np``
    fields are numpy views of the same memory: on the hot path a numpy write costs a fraction
    of a torch one. An adapter that fills everything returns ``next_obs`` and ``flags[:3]``.
    """

    obs: list[tuple[NestedKey, torch.Tensor]]
    out: list[tuple[NestedKey, torch.Tensor]]
    next_obs: dict[NestedKey, torch.Tensor]
    flags: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    traj: torch.Tensor | None
    next_obs_np: dict[NestedKey, Any]
    flags_np: tuple[Any, Any, Any, Any]


class _EnvBase:
    spec: EnvSpec
    #: Adapters whose ``_reset_arrays`` accepts a numpy mask set this (the gymnasium ones).
    _numpy_masks = False

    def _unpack_reset(self, td: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        return {k: td.get(k) for k in self.spec.observation}

    def _unpack_step(self, td: TensorDictBase) -> StepArrays:
        shape = self.spec.batch_size
        obs = {k: td.get(k) for k in self.spec.observation}
        reward = td.get("reward").reshape(shape).to(torch.float32)
        terminated = td.get("terminated").reshape(shape).to(torch.bool)
        truncated = td.get("truncated", None)
        truncated = torch.zeros(shape, dtype=torch.bool) if truncated is None else truncated.reshape(shape).bool()
        return obs, reward, terminated, truncated

    def close(self) -> None:
        """Release the environment's resources. The default does nothing."""


class BatchedEnv(_EnvBase, ABC):
    """Base class for a batch of environments stepped together, synchronously.

    Subclasses set ``self.spec`` (an `EnvSpec`) and implement `reset` and `step`. Envs are
    not auto-reset: the collector calls ``reset(mask)`` for the rows that finished.

    The collector calls these methods from a worker thread, never from the event loop thread,
    so they may block.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from aiocollect import ArraySpec, BatchedEnv, EnvSpec
        >>> class Counter(BatchedEnv):
        ...     def __init__(self):
        ...         self.spec = EnvSpec(torch.Size([2]),
        ...             observation={"observation": ArraySpec((1,), torch.float32)},
        ...             action={"action": ArraySpec((), torch.int64, kind="discrete", n=2)})
        ...         self.count = torch.zeros(2, 1)
        ...     def reset(self, mask=None, seeds=None):
        ...         self.count[mask if mask is not None else slice(None)] = 0
        ...         return TensorDict(observation=self.count.clone(), batch_size=[2])
        ...     def step(self, action):
        ...         self.count += 1
        ...         done = self.count.squeeze(-1) >= 3
        ...         return TensorDict(observation=self.count.clone(), reward=torch.ones(2),
        ...             terminated=done, truncated=torch.zeros(2, dtype=torch.bool), batch_size=[2])
        >>> env = Counter()
        >>> env.reset()["observation"].tolist()
        [[0.0], [0.0]]
    """

    @abstractmethod
    def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        """Reset the envs selected by ``mask`` (all when ``None``).

        Args:
            mask: Boolean tensor of shape ``batch_size``; True rows are reset.
            seeds: One seed per env (all envs, in order), or ``None`` to continue the env RNGs.

        Returns:
            A TensorDict of shape ``batch_size`` holding every observation key. Rows outside
            ``mask`` are ignored by the collector.
        """

    @abstractmethod
    def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step every env with ``action`` (a TensorDict holding the action keys).

        Returns:
            A TensorDict of shape ``batch_size`` with the next observation keys, ``"reward"``,
            ``"terminated"`` and (optionally) ``"truncated"``.
        """

    def _reset_arrays(self, mask: torch.Tensor | None, seeds: Sequence[int] | None) -> dict[NestedKey, torch.Tensor]:
        return self._unpack_reset(self.reset(mask, seeds))

    def _step_arrays(self, action: dict[NestedKey, torch.Tensor], out: StepOut | None = None) -> StepArrays:
        # ``out`` (where the collector will store this step) is a hint that adapters may
        # write into directly; the TensorDict protocol ignores it.
        return self._unpack_step(self.step(TensorDict(action, batch_size=self.spec.batch_size)))


class AsyncBatchedEnv(_EnvBase, ABC):
    """Base class for a batch of environments whose `reset` and `step` are coroutines.

    Use it for simulators that live elsewhere (a game server, a remote simulator): the
    collector awaits them on the event loop, so their waits overlap with everything else.
    `AsyncEnvPool` builds one from many single async envs whose steps run concurrently.

    Examples:
        >>> import anyio, torch
        >>> from tensordict import TensorDict
        >>> from aiocollect import ArraySpec, AsyncBatchedEnv, EnvSpec
        >>> class Remote(AsyncBatchedEnv):
        ...     spec = EnvSpec(torch.Size([]),
        ...         observation={"observation": ArraySpec((1,), torch.float32)},
        ...         action={"action": ArraySpec((1,), torch.float32, low=-1.0, high=1.0)})
        ...     async def reset(self, mask=None, seeds=None):
        ...         return TensorDict(observation=torch.zeros(1))
        ...     async def step(self, action):
        ...         await anyio.sleep(0)  # a network round trip in real life
        ...         return TensorDict(observation=action["action"], reward=torch.zeros(()),
        ...                           terminated=torch.tensor(False))
        >>> anyio.run(Remote().reset)["observation"].tolist()
        [0.0]
    """

    @abstractmethod
    async def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        """Reset the envs selected by ``mask``; see `BatchedEnv.reset`."""

    @abstractmethod
    async def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step every env; see `BatchedEnv.step`."""

    async def _reset_arrays(self, mask: torch.Tensor | None, seeds: Sequence[int] | None) -> dict[NestedKey, Any]:
        return self._unpack_reset(await self.reset(mask, seeds))

    async def _step_arrays(self, action: dict[NestedKey, torch.Tensor]) -> StepArrays:
        return self._unpack_step(await self.step(TensorDict(action, batch_size=self.spec.batch_size)))

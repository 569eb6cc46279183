"""aiocollect's batched-environment protocol: TensorDict in, TensorDict out, plus specs.

The collector talks to every environment through two private methods, ``_reset_arrays`` and
``_step_arrays``, which exchange plain dicts of tensors. The public ``reset``/``step`` methods
take and return TensorDicts; the base classes translate. Adapters that care about speed (the
gymnasium ones) override the private pair directly and skip the TensorDict round trip.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .._core._errors import EnvOutputError
from ._specs import EnvSpec, NestedKey

if TYPE_CHECKING:  # tensordict is imported where the TensorDict protocol is used, not by workers
    from tensordict import TensorDictBase

__all__ = ["AsyncBatchedEnv", "BatchedEnv", "StepArrays", "StepOut", "obs_label", "output_shape_error"]

#: (observation dict, reward ``[*B]`` float32, terminated ``[*B]`` bool, truncated ``[*B]`` bool)
StepArrays = tuple[dict[NestedKey, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class StepOut:
    """Where the collector stores one time step: adapters may write their results straight in.

    ``flags`` are the ``[*B]`` reward, terminated, truncated and done slices. The ``*_np``
    fields are numpy views of the same memory: on the hot path a numpy write costs a fraction
    of a torch one. An adapter that fills everything returns ``next_obs`` and ``flags[:3]``.
    ``obs_np``, ``out_np`` and ``traj_np`` are the rollout's own numpy twins of ``obs``,
    ``out`` and ``traj`` (adapters do not touch them). ``next_extra`` holds the slices of the
    spec's ``next_only`` entries, which the rollout copies from the step's observation dict.
    """

    obs: list[tuple[NestedKey, torch.Tensor]]
    out: list[tuple[NestedKey, torch.Tensor]]
    next_obs: dict[NestedKey, torch.Tensor]
    flags: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    traj: torch.Tensor | None
    next_obs_np: dict[NestedKey, Any]
    flags_np: tuple[Any, Any, Any, Any]
    obs_np: list[tuple[NestedKey, Any]] = field(default_factory=list)
    out_np: dict[NestedKey, Any] = field(default_factory=dict)
    traj_np: Any = None
    next_extra: list[tuple[NestedKey, torch.Tensor]] = field(default_factory=list)


def output_shape_error(
    env: str, what: str, got: Any, method: str, promise: str, fix: str, where: str = ""
) -> EnvOutputError:
    """The error for an env output whose shape is not the promised one (one format for every env kind).

    Reads "env CartPole-v1 (gymnasium.Env) returned observation of shape (2, 2) from step();
    its observation_space promises (4,); fix the env or its observation_space".
    """
    return EnvOutputError(f"env {env} returned {what} of shape {tuple(got)} from {method}{where}; {promise}; {fix}")


def obs_label(key: NestedKey) -> str:
    """How errors name an observation key: ``observation``, ``observation 'pixels'``, ..."""
    return "observation" if key == "observation" else f"observation {key!r}"


class _Promise:
    """The output shapes an `EnvSpec` promises, computed once and compared on every step."""

    def __init__(self, spec: EnvSpec) -> None:
        self.spec = spec
        self.batch = torch.Size(spec.batch_size)
        self.batch1 = torch.Size((*spec.batch_size, 1))  # TorchRL's [*B, 1] reward/done layout
        self.obs = {k: torch.Size((*spec.batch_size, *s.shape)) for k, s in spec.observation.items()}


def _describe(env: _EnvBase) -> str:
    kind = "AsyncBatchedEnv" if isinstance(env, AsyncBatchedEnv) else "BatchedEnv"
    return f"{type(env).__name__} (aiocollect.{kind})"


def _obs(env: _EnvBase, promise: _Promise, td: TensorDictBase, method: str) -> dict[NestedKey, torch.Tensor]:
    want = promise.obs
    obs = {k: td.get(k) for k in want}
    for k, v in obs.items():
        if v.shape != want[k]:
            nb = len(promise.batch)
            rule = (
                f"its spec promises {tuple(want[k])} (batch_size {tuple(promise.batch)} + "
                f"observation shape {tuple(want[k][nb:])})"
            )
            raise output_shape_error(_describe(env), obs_label(k), v.shape, method, rule, "fix the env or its spec")
    return obs


def _flag(env: _EnvBase, promise: _Promise, value: torch.Tensor, key: str) -> torch.Tensor:
    if value.shape == promise.batch:
        return value
    if value.shape == promise.batch1:
        return value.reshape(promise.batch)  # a view
    rule = f"its spec's batch_size promises {tuple(promise.batch)} (or {tuple(promise.batch1)})"
    raise output_shape_error(_describe(env), key, value.shape, "step()", rule, "fix the env or its spec")


class _EnvBase:
    spec: EnvSpec
    #: Adapters whose ``_reset_arrays`` accepts a numpy mask set this (the gymnasium ones).
    _numpy_masks = False
    #: True right after ``_reset_arrays`` when the observations it returned hold every env's
    #: next observation (the rows it reset and the others alike) and stay unchanged until the
    #: env's next step: the rollout then takes them as they are instead of merging the reset
    #: rows into its own copy. Adapters that know it set it (the gymnasium ones).
    _reset_full = False
    _spec_shapes: _Promise | None = None

    def _promised(self) -> _Promise:
        promise = self._spec_shapes
        if promise is None or promise.spec is not self.spec:
            promise = self._spec_shapes = _Promise(self.spec)
        return promise

    # The TensorDict protocol's outputs are checked against the spec here, so a wrong shape
    # raises instead of being broadcast or reshaped into the batch; (*B, 1) flags (TorchRL's
    # layout) are the one accepted variant.
    def _unpack_reset(self, td: TensorDictBase) -> dict[NestedKey, torch.Tensor]:
        return _obs(self, self._promised(), td, "reset()")

    def _unpack_step(self, td: TensorDictBase) -> StepArrays:
        promise = self._promised()
        obs = _obs(self, promise, td, "step()")
        reward = _flag(self, promise, td.get("reward"), "reward").to(torch.float32)
        terminated = _flag(self, promise, td.get("terminated"), "terminated").to(torch.bool)
        truncated = td.get("truncated", None)
        if truncated is None:
            truncated = torch.zeros(promise.batch, dtype=torch.bool)
        else:
            truncated = _flag(self, promise, truncated, "truncated").bool()
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
            A TensorDict of shape ``batch_size`` holding every observation key, each of shape
            ``(*batch_size, *spec.observation[key].shape)``. Rows outside ``mask`` are ignored
            by the collector.
        """

    @abstractmethod
    def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step every env with ``action`` (a TensorDict holding the action keys).

        Returns:
            A TensorDict of shape ``batch_size`` with the next observation keys (shaped as in
            `reset`), ``"reward"``, ``"terminated"`` and (optionally) ``"truncated"``, each of
            shape ``batch_size`` or TorchRL's ``(*batch_size, 1)``. The collector raises
            `EnvOutputError` for any other shape; it never reshapes or broadcasts.
        """

    def _reset_arrays(self, mask: torch.Tensor | None, seeds: Sequence[int] | None) -> dict[NestedKey, torch.Tensor]:
        return self._unpack_reset(self.reset(mask, seeds))

    def _step_arrays(self, action: dict[NestedKey, torch.Tensor], out: StepOut | None = None) -> StepArrays:
        # ``out`` (where the collector will store this step) is a hint that adapters may
        # write into directly; the TensorDict protocol ignores it.
        from tensordict import TensorDict

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

    #: Seconds a cancelled `step` or `reset` may take to end before it is left running (with a
    #: warning). Every collector sets it to its ``shutdown_timeout``; an env that runs its own
    #: tasks (`AsyncEnvPool`) bounds its cancellation with it.
    cancel_grace: float = 10.0

    @abstractmethod
    async def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        """Reset the envs selected by ``mask``; see `BatchedEnv.reset`."""

    @abstractmethod
    async def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step every env; see `BatchedEnv.step`."""

    async def _reset_arrays(self, mask: torch.Tensor | None, seeds: Sequence[int] | None) -> dict[NestedKey, Any]:
        return self._unpack_reset(await self.reset(mask, seeds))

    async def _step_arrays(self, action: dict[NestedKey, torch.Tensor]) -> StepArrays:
        from tensordict import TensorDict

        return self._unpack_step(await self.step(TensorDict(action, batch_size=self.spec.batch_size)))

    async def aclose(self) -> None:
        """Release the envs' resources on the event loop (sockets, streams); calls `close` by default.

        The collector awaits it on its event loop, within ``shutdown_timeout``.
        """
        self.close()

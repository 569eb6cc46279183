"""TorchRL environments (any ``torchrl.envs.EnvBase``) as an aiocollect `BatchedEnv`.

torchrl is an optional dependency: this module imports it only when a TorchRL env is
actually handed to a collector (`is_torchrl_env` looks in ``sys.modules`` first, so a
process that never imported torchrl never will).

The adapter keeps TorchRL's own "root" TensorDict between calls, as TorchRL's collector
does: transforms such as ``StepCounter`` or ``RewardSum`` read their running state from the
root they are stepped with, and a partial reset (``"_reset"``) keeps the rows it does not
reset. So a TorchRL env yields, under aiocollect, the same values it yields under TorchRL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .._core._optional import is_instance_of
from ._base import BatchedEnv, StepArrays, StepOut
from ._specs import ArraySpec, EnvSpec, NestedKey

if TYPE_CHECKING:
    from tensordict import TensorDictBase

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


def _unbatched(spec: Any, nb: int) -> Any:
    # A batched env's leaf specs carry the batch dims (ParallelEnv(4, ...): [4, *shape]);
    # aiocollect's ArraySpec is per env, so take env 0's (they are identical by construction).
    return spec[(0,) * nb] if nb else spec


def _array_spec(key: NestedKey, spec: Any, nb: int) -> ArraySpec:
    from torchrl.data import Binary, Bounded, Categorical, MultiCategorical, MultiOneHot, OneHot

    one = _unbatched(spec, nb)
    shape, dtype = tuple(one.shape), one.dtype
    if isinstance(one, OneHot):
        return ArraySpec(shape, dtype, kind="one_hot", n=int(one.space.n))
    if isinstance(one, MultiOneHot):
        raise TypeError(
            f"TorchRL env entry {key!r} is a MultiOneHot spec, which has no aiocollect equivalent; "
            "use MultiCategorical (index) actions instead"
        )
    if isinstance(one, Binary):
        return ArraySpec(shape, dtype, kind="binary")
    if isinstance(one, MultiCategorical):
        return ArraySpec(shape, dtype, kind="multi_discrete", nvec=torch.as_tensor(one.nvec))
    if isinstance(one, Categorical):
        return ArraySpec(shape, dtype, kind="discrete", n=int(one.space.n))
    if isinstance(one, Bounded):
        return ArraySpec(shape, dtype, low=one.space.low.clone(), high=one.space.high.clone())
    return ArraySpec(shape, dtype)


def _leaves(composite: Any, nb: int) -> dict[NestedKey, ArraySpec]:
    return {k: _array_spec(k, composite[k], nb) for k in composite.keys(True, True)}


def _tup(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _key(key: tuple[str, ...]) -> NestedKey:
    return key[0] if len(key) == 1 else key


#: Done entries at the root that the rollout's own flags carry (``("next", "done")``, ...).
_ROOT_FLAGS = {("done",), ("terminated",), ("truncated",)}


def _any_row(td: TensorDictBase, keys: list[NestedKey], batch: tuple[int, ...]) -> torch.Tensor:
    """True for each env whose entries under ``keys`` hold any True (TorchRL's end of trajectory)."""
    out = torch.zeros(batch, dtype=torch.bool)
    for key in keys:
        value = td.get(key)
        out |= value.reshape(*batch, -1).any(-1) if value.dim() > len(batch) else value
    return out


class TorchRLEnv(BatchedEnv):
    """A ``torchrl.envs.EnvBase`` (``GymEnv``, ``TransformedEnv``, ``SerialEnv``, ``ParallelEnv``, ...).

    Collectors wrap TorchRL envs in this for you: ``create_env_fn`` may be a TorchRL env, a
    factory returning one, or an ``EnvCreator``. Every entry of the env's observation spec
    becomes an observation key (``"observation"``, ``"pixels"``, ``"step_count"`` of a
    ``StepCounter``, ``"episode_reward"`` of a ``RewardSum``, ...), every entry of its action
    spec an action key, with the env's own shapes and dtypes.

    Args:
        env: The TorchRL env. Its batch size becomes the collector's env batch.

    Examples:
        >>> from torchrl.envs import GymEnv  # doctest: +SKIP
        >>> env = TorchRLEnv(GymEnv("Pendulum-v1"))  # doctest: +SKIP
        >>> sorted(env.spec.observation), tuple(env.spec.batch_size)  # doctest: +SKIP
        (['observation'], ())
    """

    #: The rollout passes the policy's ("next", <observation key>) outputs with the action:
    #: TorchRL's ``step`` keeps them in "next" (a recurrent policy's next state).
    _takes_next = True
    #: ``Collector.set_seed(s)`` seeds the env with ``s`` itself (TorchRL's semantics).
    _seeds_as_given = True

    def __init__(self, env: Any) -> None:
        self.env = env
        self._nb = len(env.batch_size)
        self._batch = tuple(env.batch_size)
        rewards = [_tup(k) for k in env.reward_keys]
        dones = [_tup(k) for k in env.done_keys]
        # A single agent's reward and done flags are the rollout's own ("next", "reward"), ...
        # Anything else (per-agent or per-group entries of a multi-agent env, a reward under
        # another name) is recorded as TorchRL records it: rewards under "next" only, done
        # entries at the root and under "next" (TorchRL's step_mdp carries them over).
        self._simple = set(dones) <= _ROOT_FLAGS and ("done",) in dones and rewards == [("reward",)]
        rs, ds = env.full_reward_spec, env.full_done_spec
        next_only = {_key(k): _array_spec(_key(k), rs[k], self._nb) for k in rewards if k != ("reward",)}
        flag_obs = {_key(k): _array_spec(_key(k), ds[k], self._nb) for k in dones if k not in _ROOT_FLAGS}
        self._reward_keys = [_key(k) for k in rewards]
        self._trunc_keys = [_key(k) for k in dones if k[-1] == "truncated"]
        self._term_keys = [_key(k) for k in dones if k[-1] != "truncated"]
        self._terminated_key = "terminated" if ("terminated",) in dones else "done"
        self._reset_keys = list(env.reset_keys)
        # The done entries at each reset key's level: what TorchRL's "_reset" there follows.
        self._level_dones = {r: [_key(d) for d in dones if d[:-1] == _tup(r)[:-1]] for r in self._reset_keys}
        action = _leaves(env.full_action_spec, self._nb)
        # State-spec entries (a recurrent policy's state from a TensorDictPrimer) are read and
        # recorded like observations: TorchRL's collector keeps them at the root and in "next".
        state = {k: v for k, v in _leaves(env.full_state_spec, self._nb).items() if k not in action}
        observation = {**state, **_leaves(env.observation_spec, self._nb), **flag_obs}
        self.spec = EnvSpec(env.batch_size, observation=observation, action=action, next_only=next_only,
                            root_reward=("reward",) in rewards)  # fmt: skip
        self._root: TensorDictBase | None = None  # what TorchRL's collector calls its shuttle

    def set_seed(self, seed: int) -> int:
        """Seed the env as TorchRL does (``env.set_seed``); returns the env's next seed."""
        return int(self.env.set_seed(int(seed)))

    def _reset_root(self, mask: Any) -> TensorDictBase:
        root = self._root
        if root is None or mask is None:
            root = self.env.reset()
        else:
            mask = torch.as_tensor(mask, dtype=torch.bool)
            if not bool(mask.any()):
                return root
            if self._nb == 0 or bool(mask.all()):
                root = self.env.reset()
            else:
                td = root.copy()  # shallow: env.reset writes the reset rows into a new root
                for key in self._reset_keys:
                    td.set(key, self._reset_flag(root, key, mask))
                root = self.env.reset(td)
                root.exclude(*self._reset_keys, inplace=True)
        self._root = root
        return root

    def _reset_flag(self, root: TensorDictBase, key: NestedKey, mask: torch.Tensor) -> torch.Tensor:
        """TorchRL's ``"_reset"`` at ``key``'s level for the envs in ``mask``.

        An env that ended because some of its done entries say so resets the levels (agent
        groups) that are done, as under TorchRL's collector; an env the collector ends itself
        (``max_frames_per_traj``, a full reset) resets at every level.
        """
        level = self._level_dones[key]
        done = root.get(level[0])
        for k in level[1:]:
            done = done | root.get(k)
        row = mask.reshape(*mask.shape, *([1] * (done.dim() - self._nb)))
        if self._simple:
            return row.expand(done.shape).clone()
        ended_by_env = _any_row(root, self._term_keys + self._trunc_keys, self._batch)
        by_collector = (~ended_by_env).reshape(row.shape)
        return (row & (done | by_collector)).expand(done.shape).clone()

    def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        """Reset the rows selected by ``mask`` (TorchRL's ``"_reset"``); see `BatchedEnv.reset`.

        ``seeds`` (one per env) seed the TorchRL env with the first of them (``env.set_seed``
        seeds a batched env's sub-envs itself) before it resets.
        """
        if seeds is not None:
            self.set_seed(int(seeds[0]))
            mask = None
        return self._reset_root(mask)

    def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step the env with ``action``; returns TorchRL's ``"next"`` TensorDict."""
        return self._step_with(action.items(include_nested=True, leaves_only=True))

    def _step_with(self, action: Any) -> TensorDictBase:
        root = self._root if self._root is not None else self._reset_root(None)
        td = root.copy()  # shallow: the root's tensors are not copied
        for key, value in action:
            td.set(key, value)
        nxt = self.env.step(td).get("next")
        # TorchRL's step_mdp: the next root is "next" without the reward.
        self._root = nxt.exclude(*self._reward_keys)
        return nxt

    def _reset_arrays(self, mask: Any, seeds: Sequence[int] | None) -> dict[NestedKey, torch.Tensor]:
        return self._unpack_reset(self.reset(mask, seeds))

    def _step_arrays(self, action: dict[NestedKey, torch.Tensor], out: StepOut | None = None) -> StepArrays:
        nxt = self._step_with(action.items())
        if self._simple:
            if self._terminated_key != "terminated":  # only "done": read it as aiocollect's termination
                nxt = nxt.copy().set("terminated", nxt.get(self._terminated_key))
            return self._unpack_step(nxt)
        obs = {k: nxt.get(k) for k in self.spec.observation}
        obs.update((k, nxt.get(k)) for k in self.spec.next_only)
        reward = nxt.get("reward").reshape(self._batch) if self.spec.root_reward else torch.zeros(self._batch)
        trunc = _any_row(nxt, self._trunc_keys, self._batch)
        term = _any_row(nxt, self._term_keys, self._batch)
        return obs, reward.to(torch.float32), term, trunc

    def close(self) -> None:
        """Close the TorchRL env (a ``ParallelEnv`` stops its workers)."""
        if not self.env.is_closed:
            self.env.close()

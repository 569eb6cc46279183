"""Gymnasium adapters: a single ``gymnasium.Env`` or a ``VectorEnv`` as a `BatchedEnv`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from ._base import BatchedEnv, StepArrays, StepOut, output_shape_error
from ._gym_spaces import Source, flatten_space, obs_shape_error, to_gym_action, write_obs, write_row
from ._specs import EnvSpec, NestedKey

if TYPE_CHECKING:  # only the public reset/step build TensorDicts: workers never import it
    from tensordict import TensorDictBase

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

    Raises:
        TypeError: ``env`` is not a gymnasium env, or uses a space that has no tensor form.

    Each observation the env returns must have its space's shape (a vector env's:
    ``(num_envs, *shape)``, and one reward/terminated/truncated value per sub-env); any
    other shape raises `EnvOutputError` from ``reset``/``step``, naming the env, the key and
    both shapes. Values are never reshaped or broadcast into the batch.

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


def _source(env: Any, kind: str, space: str) -> Source:
    """Name the env in shape errors by its gymnasium id, else by its (unwrapped) class."""
    name = getattr(getattr(env, "spec", None), "id", None) or type(getattr(env, "unwrapped", env)).__name__
    return Source(f"{name} ({kind})", space)


def _plain(leaves: list[Any]) -> bool:
    """One leaf at the top of the space, stored as gymnasium gives it (no offset, no one-hot)."""
    if len(leaves) != 1 or leaves[0].path != ():
        return False
    leaf = leaves[0]
    return leaf.spec.kind != "one_hot" and (leaf.start is None or not np.any(leaf.start != 0))


class _GymBase(BatchedEnv):
    _numpy_masks = True  # _reset_arrays takes the collector's numpy done masks
    _numpy_actions = True  # _step_arrays takes numpy actions as well as tensors

    def __init__(self, env: Any, obs_space: Any, act_space: Any, batch: torch.Size, one_hot: bool, src: Source) -> None:
        self.env, self._src = env, src
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
        self._reset_obs_np = {k: v.numpy() for k, v in self._reset_obs.items()}
        # Plain spaces (one Box/Discrete/... at the top, CartPole's kind) take a numpy fast
        # path on every step; anything nested goes through the generic converters.
        self._plain_obs = _plain(self._obs_leaves)
        self._plain_act = _plain(self._act_leaves)
        self._obs_key = self._obs_leaves[0].key
        self._plain_shape = (*batch, *self._obs_leaves[0].spec.shape) if self._plain_obs else None
        self._act_key = self._act_leaves[0].key
        self._act_dtype = getattr(self._act_leaves[0].space, "dtype", None) if self._plain_act else None
        self._act_int = self._plain_act and self._act_leaves[0].spec.kind == "discrete"
        # Whether `_step_numpy` (the fused loop's step) takes this env's actions: one plain
        # array of a known dtype (and, for a vector env, one plain observation array).
        self._step_numpy_ok = self._plain_act and self._act_dtype is not None

    def _write_reset(self, obs: Any) -> None:
        """Copy a whole reset observation into ``_reset_obs`` (numpy for a plain array: as `_step_arrays`)."""
        if self._plain_obs and getattr(obs, "shape", None) == self._plain_shape:
            self._reset_obs_np[self._obs_key][...] = obs  # a fraction of the torch conversion's cost
        else:
            write_obs(self._obs_leaves, obs, self._reset_obs, self._src, "reset()")

    def _gym_action(self, action: dict[NestedKey, Any], single: bool) -> Any:
        if not self._plain_act:
            return to_gym_action(self._act_leaves, action, single=single)
        a = action[self._act_key]
        if type(a) is np.ndarray and a.dtype == self._act_dtype:  # as the fused loop hands it over
            return int(a) if single and self._act_int else a
        if isinstance(a, np.ndarray):
            arr = a
        else:
            if a.requires_grad or a.device.type != "cpu":
                a = a.detach().cpu()
            arr = a.numpy()
        if self._act_dtype is not None and arr.dtype != self._act_dtype:
            arr = arr.astype(self._act_dtype)
        return int(arr) if single and self._act_int else arr

    def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        """Reset the selected envs; see `BatchedEnv.reset`."""
        from tensordict import TensorDict

        out = self._reset_arrays(mask, seeds)
        return TensorDict({k: v.clone() for k, v in out.items()}, batch_size=self.spec.batch_size)

    def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step the envs; see `BatchedEnv.step`."""
        from tensordict import TensorDict

        obs, reward, term, trunc = self._step_arrays({k: action.get(k) for k in self.spec.action})
        data = {k: v.clone() for k, v in obs.items()}
        data.update(reward=reward, terminated=term, truncated=trunc)
        return TensorDict(data, batch_size=self.spec.batch_size)

    def close(self) -> None:
        """Close the wrapped gymnasium env."""
        self.env.close()


class _GymSingle(_GymBase):
    _reset_full = True  # a reset writes the one env's whole observation

    def __init__(self, env: gym.Env[Any, Any], one_hot: bool) -> None:
        src = _source(env, "gymnasium.Env", "observation_space")
        super().__init__(env, env.observation_space, env.action_space, torch.Size([]), one_hot, src)

    def _reset_arrays(self, mask: torch.Tensor | None, seeds: Sequence[int] | None) -> dict[NestedKey, torch.Tensor]:
        obs, _ = self.env.reset(seed=None if seeds is None else int(seeds[0]))
        self._write_reset(obs)
        return self._reset_obs

    def _step_arrays(self, action: dict[NestedKey, Any], out: StepOut | None = None) -> StepArrays:
        obs, reward, term, trunc, _ = self.env.step(self._gym_action(action, single=True))
        if out is not None:
            self._write_step(out, obs, reward, term, trunc)
            flags = out.flags
            return out.next_obs, flags[0], flags[1], flags[2]
        write_obs(self._obs_leaves, obs, self._obs, self._src, "step()")
        return (
            self._obs,
            torch.tensor(float(reward), dtype=torch.float32),
            torch.tensor(bool(term)),
            torch.tensor(bool(trunc)),
        )

    def _step_numpy(self, action: np.ndarray, out: StepOut) -> bool | None:
        """`_step_arrays` for the fused loop: a numpy action, everything written into ``out``.

        Returns ``False`` when the episode goes on, ``None`` when it ended (a single env never
        resets itself: the caller checks ``done`` and resets it).
        """
        if self._act_int:
            obs, reward, term, trunc, _ = self.env.step(int(action))
        else:
            a = action if action.dtype == self._act_dtype else action.astype(self._act_dtype)
            obs, reward, term, trunc, _ = self.env.step(a)
        return None if self._write_step(out, obs, reward, term, trunc) else False

    def _write_step(self, out: StepOut, obs: Any, reward: Any, term: Any, trunc: Any) -> bool:
        """Write the step into ``out``; returns whether the episode ended."""
        if type(obs) is np.ndarray and obs.shape == self._plain_shape and self._plain_obs:
            # One plain array of the promised shape: numpy writes straight into the
            # collector's storage (a fraction of the cost of torch ops on 0-d tensors).
            out.next_obs_np[self._obs_key][...] = obs
        else:
            write_obs(self._obs_leaves, obs, out.next_obs, self._src, "step()")
        rew, term_dst, trunc_dst, done = out.flags_np
        rew[()] = float(reward)
        te, tr = bool(term), bool(trunc)
        term_dst[()], trunc_dst[()], done[()] = te, tr, te or tr
        return te or tr


class _GymVector(_GymBase):
    def __init__(self, env: gym.vector.VectorEnv, one_hot: bool) -> None:
        src = _source(env, "gymnasium.vector.VectorEnv", "single_observation_space")
        batch = torch.Size([env.num_envs])
        super().__init__(env, env.single_observation_space, env.single_action_space, batch, one_hot, src)
        # Promised shapes, as tuples: numpy's .shape is a tuple, so each check is one compare.
        self._flag_shape = (env.num_envs,)
        mode = env.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        self._same_step = gym.vector.AutoresetMode(mode) == gym.vector.AutoresetMode.SAME_STEP
        self._auto_reset = np.zeros(env.num_envs, dtype=np.bool_)
        self._no_rows = bytes(env.num_envs)  # a row mask's bytes when no row is selected
        self._stashed = False  # this step copied every row's next observation into _reset_obs
        self._ended: np.ndarray | None = None  # the rows gymnasium reset in this step (_step_into)
        self._step_numpy_ok = self._step_numpy_ok and self._plain_obs

    def _reset_arrays(self, mask: Any, seeds: Sequence[int] | None) -> dict[NestedKey, torch.Tensor]:
        seed = None if seeds is None else [int(s) for s in seeds]
        if mask is not None and not isinstance(mask, np.ndarray):
            mask = mask.numpy()
        if mask is None or (not self._same_step and bool(mask.all())):
            obs, _ = self.env.reset(seed=seed)
            self._write_reset(obs)
            self._auto_reset[:] = False
            self._reset_full, self._stashed = True, False
            return self._reset_obs
        # In SAME_STEP mode gymnasium already reset the rows that ended during step() and their
        # reset observations were stashed then; only the other rows (ended by the collector's
        # own step limit) need a real reset. (Runs at every episode end: one ufunc, and a
        # bytes compare instead of need.any(), which costs ten times more at this size.)
        need = mask.astype(np.bool_, copy=False) > self._auto_reset
        if need.tobytes() != self._no_rows:
            obs, _ = self.env.reset(seed=seed, options={"reset_mask": need})
            write_obs(self._obs_leaves, obs, self._reset_obs, self._src, "reset()", rows=need)
        self._auto_reset[:] = False
        # The rows gymnasium reset, the rows reset here and the others' next observations: all
        # of them, if this step stashed every row.
        self._reset_full, self._stashed = self._stashed, False
        return self._reset_obs

    def _step_arrays(self, action: dict[NestedKey, Any], out: StepOut | None = None) -> StepArrays:
        self._stashed, self._ended = False, None
        obs, reward, term, trunc, info = self.env.step(self._gym_action(action, single=False))
        if isinstance(out, StepOut) and self._plain_obs:
            self._step_into(out, obs, reward, term, trunc, info)
            return out.next_obs, out.flags[0], out.flags[1], out.flags[2]
        dst = self._obs if out is None else out.next_obs  # the collector's storage: one copy fewer
        write_obs(self._obs_leaves, obs, dst, self._src, "step()")
        reward = np.asarray(reward, dtype=np.float32)
        term, trunc = np.asarray(term, dtype=np.bool_), np.asarray(trunc, dtype=np.bool_)
        want = self._flag_shape
        if reward.shape != want or term.shape != want or trunc.shape != want:
            self._check_flags(reward, term, trunc)
        if self._same_step and "_final_obs" in info:
            # gymnasium returned reset observations for finished rows and put the terminal
            # ones in info; the transition must hold the terminal observation.
            # The collector reads reset observations only for those rows, so a plain copy of
            # every row is enough (and cheaper than a masked one).
            self._auto_reset = np.asarray(info["_final_obs"], dtype=np.bool_).copy()
            for k, v in dst.items():
                self._reset_obs[k].copy_(v)
            self._stashed = True
            for i in np.flatnonzero(self._auto_reset):
                write_row(self._obs_leaves, info["final_obs"][i], dst, int(i), self._src, "step()", _final(i))
        return dst, torch.from_numpy(reward), torch.from_numpy(term), torch.from_numpy(trunc)

    def _step_numpy(self, action: np.ndarray, out: StepOut) -> np.ndarray | None:
        """`_step_arrays` for the fused loop: a numpy action, everything written into ``out``.

        One call per step instead of three (the action's conversion, the step, the writes):
        at CartPole's size the calls cost as much as the writes. Returns the rows that ended
        when this step already reset exactly those (SAME_STEP: every row's next input is then
        ``_reset_obs``, whole, and the stash is taken, as `_autoreset_rows`); else ``None``,
        and the caller checks ``done`` as after `_step_arrays`.
        """
        self._stashed, self._ended = False, None
        if action.dtype != self._act_dtype:
            action = action.astype(self._act_dtype)
        obs, reward, term, trunc, info = self.env.step(action)
        if self._step_into(out, obs, reward, term, trunc, info) is None:
            return None
        return self._autoreset_rows(out.flags_np[3])

    def _autoreset_rows(self, done: np.ndarray) -> np.ndarray | None:
        """`_reset_arrays(done)` for the fused loop, when the step just taken already did it.

        In SAME_STEP mode gymnasium resets exactly the rows that ended, and `_step_into` then
        stashed every row's next input in ``_reset_obs``: this does `_reset_arrays`'
        bookkeeping and returns those rows (the caller takes ``_reset_obs`` whole). ``None``
        when that is not the case (``done`` holds other rows, or the step took another path):
        call `_reset_arrays`.
        """
        ended = self._ended
        if ended is None or done.tobytes() != self._auto_reset.tobytes():
            return None
        self._auto_reset[:] = False
        self._stashed, self._ended, self._reset_full = False, None, True
        return ended

    def _check_flags(self, reward: Any, term: Any, trunc: Any) -> None:
        """Raise for the first of reward/terminated/truncated that is not one value per sub-env."""
        n = self.env.num_envs
        for name, value in (("reward", reward), ("terminated", term), ("truncated", trunc)):
            if np.shape(value) != (n,):
                rule = f"a VectorEnv with num_envs={n} promises ({n},)"
                fix = f"fix the env to return one {name} value per sub-env"
                raise output_shape_error(self._src.env, name, np.shape(value), "step()", rule, fix)

    def _check_step(self, obs: Any, dst: Any, reward: Any, term: Any, trunc: Any) -> None:
        """`_step_into`'s slow check, for values that are not plain arrays (or have a wrong shape)."""
        if np.shape(obs) != dst.shape:
            raise obs_shape_error(self._src, self._obs_leaves[0], obs, self._flag_shape, "step()")
        self._check_flags(reward, term, trunc)

    def _step_into(self, out: StepOut, obs: Any, reward: Any, term: Any, trunc: Any, info: Any) -> np.ndarray | None:
        # Everything lands in the collector's storage with numpy writes, which cost far less
        # than torch ones at this size. Returns the rows gymnasium reset (SAME_STEP), if any.
        key = self._obs_leaves[0].key
        dst = out.next_obs_np[key]
        rew, term_dst, trunc_dst, done = out.flags_np
        # np.copyto broadcasts: compare shapes first (four tuple compares, no copies, ~0.3 us),
        # so a wrongly shaped value raises instead of being spread over the batch.
        want = self._flag_shape
        try:
            ok = obs.shape == self._plain_shape and reward.shape == want and term.shape == want and trunc.shape == want
        except AttributeError:  # lists or scalars: numpy works out their shapes
            ok = False
        if not ok:
            self._check_step(obs, dst, reward, term, trunc)
        # Item assignment casts like np.copyto(casting="unsafe") at about half its cost.
        dst[...] = obs
        rew[...] = reward
        term_dst[...] = term
        trunc_dst[...] = trunc
        np.logical_or(term_dst, trunc_dst, out=done)
        if self._same_step and "_final_obs" in info:
            # gymnasium returned reset observations for finished rows and put the terminal
            # ones in info: keep the former for the collector, record the latter.
            self._auto_reset[...] = info["_final_obs"]
            self._reset_obs_np[key][...] = dst
            self._stashed = True
            final, row = info["final_obs"], self._plain_shape[1:]  # type: ignore[index]
            self._ended = ended = self._auto_reset.nonzero()[0]  # np.flatnonzero's work, without its wrapper
            for i in ended:
                f = final[i]
                if getattr(f, "shape", None) != row and np.shape(f) != row:
                    raise obs_shape_error(self._src, self._obs_leaves[0], f, (), "step()", _final(i))
                dst[i] = f
            return ended
        return None


def _final(i: Any) -> str:
    return f" as info['final_obs'][{int(i)}]"

"""AsyncEnvPool: many single async envs stepped concurrently as one `AsyncBatchedEnv`.

Per env and step the pool pays for one task (`_gather.each`), one action taken from a batch
converted once, and numpy writes of the results into preallocated tensors; everything else
is per batch step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import torch
from tensordict import TensorDict, TensorDictBase

from .._core._errors import EnvTimeoutError, note_once
from .._core._validate import check_choice, check_int
from . import _gcfreeze
from ._base import AsyncBatchedEnv, StepArrays
from ._gather import each
from ._gym_spaces import Source, fast_row_writer, flatten_space, to_gym_action, write_row
from ._specs import EnvSpec, NestedKey

__all__ = ["ON_ERROR", "ON_TIMEOUT", "AsyncEnv", "AsyncEnvPool", "PoolCounters"]

#: Pools at least this large freeze the garbage collector by default (``gc_freeze=None``).
GC_FREEZE_MIN_ENVS = 256
#: The failure rules of an env step (and of a coroutine policy call): stop, or end the trajectory.
ON_TIMEOUT, ON_ERROR = ("error", "truncate"), ("raise", "reset")


class AsyncEnv(Protocol):
    """A single gymnasium-style environment whose ``reset`` and ``step`` are coroutines."""

    observation_space: Any
    action_space: Any

    async def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]: ...

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]: ...


@dataclass
class PoolCounters:
    """Env steps an `AsyncEnvPool` recorded as truncations instead of raising.

    Attributes:
        errors: Steps that raised (``on_error="reset"``).
        timeouts: Steps that ran past ``step_timeout`` (``on_timeout="truncate"``).
    """

    errors: int = 0
    timeouts: int = 0


class AsyncEnvPool(AsyncBatchedEnv):
    """A batch of single async envs whose steps run concurrently on the event loop.

    Each env is a gymnasium-style object with ``observation_space``, ``action_space``,
    ``async reset(seed=None) -> (obs, info)`` and ``async step(action) -> (obs, reward,
    terminated, truncated, info)``; an optional synchronous ``close()`` is called by
    `close`. A batch step waits for the slowest env, so 64 envs that each wait 10 ms
    take about 10 ms per batch step, not 640 ms.

    An env's failing step is an error that names the env (its own exception, with a note),
    and a step that runs past ``step_timeout`` an `EnvTimeoutError`. Opt in to
    ``on_error="reset"`` / ``on_timeout="truncate"`` to record such a step as a truncation
    instead: its next observation is the env's last one, its reward 0 and
    ``("next", "truncated")`` True, so the collector resets that env and its trajectory ends
    there; `counters` (and the collector's ``stats()``) count these steps.

    Args:
        envs: The envs, all with the same spaces.
        one_hot: Encode ``Discrete`` spaces as one-hot vectors instead of int64 indices.
        max_concurrency: At most this many env steps (or resets) in flight at once, for
            rate-limited services; ``None``: all of them.
        step_timeout: Seconds one env's ``step`` may take; ``None``: no limit.
        on_timeout: ``"error"`` (raise `EnvTimeoutError` naming the env) or ``"truncate"``.
        on_error: ``"raise"`` (the env's exception, noting the env) or ``"reset"``.
        min_ready: Make the pool barrier-free: envs step independently, and the policy
            runs as soon as this many envs have an observation ready (EnvPool's async
            mode). Batches are then flat ``[frames_per_batch]``, grouped by env; see
            ``docs/async-envs.md``. ``None``: lock-step batches ``[num_envs, T]``.
        max_wait: With ``min_ready``, run the policy on the envs that are ready after this
            many seconds even if fewer than ``min_ready`` are.
        gc_freeze: While the pool runs (from its first reset to `close`), keep Python's
            cyclic garbage collector off the objects that existed before (``gc.freeze()``,
            undone by the last pool to close). With a thousand envs in flight, full
            collections otherwise stall the event loop for 150-200 ms several times a
            second; see ``docs/async-envs.md``. ``None`` (default): on for pools of at
            least 256 envs.

    Examples:
        >>> import anyio
        >>> from aiocollect.testing import SleepyAsyncEnv
        >>> pool = AsyncEnvPool([SleepyAsyncEnv(delay=0.0) for _ in range(4)])
        >>> td = anyio.run(pool.reset)
        >>> td.batch_size
        torch.Size([4])
    """

    def __init__(
        self,
        envs: Sequence[AsyncEnv],
        *,
        one_hot: bool = False,
        max_concurrency: int | None = None,
        step_timeout: float | None = None,
        on_timeout: str = "error",
        on_error: str = "raise",
        min_ready: int | None = None,
        max_wait: float | None = None,
        gc_freeze: bool | None = None,
    ) -> None:
        if not envs:
            raise ValueError("AsyncEnvPool needs at least one env, got an empty sequence")
        check_int("max_concurrency", max_concurrency, allow_none=True)
        if step_timeout is not None and (isinstance(step_timeout, bool) or not isinstance(step_timeout, (int, float))
                                         or not step_timeout > 0):  # fmt: skip
            raise ValueError(f"step_timeout must be a positive number of seconds or None, got {step_timeout!r}")
        check_choice("on_timeout", on_timeout, ON_TIMEOUT)
        check_choice("on_error", on_error, ON_ERROR)
        check_int("min_ready", min_ready, allow_none=True)
        if min_ready is not None and min_ready > len(envs):
            raise ValueError(f"min_ready must be at most the number of envs ({len(envs)}), got {min_ready}")
        if max_wait is not None:
            if min_ready is None:
                raise ValueError("max_wait only applies to barrier-free pools; pass min_ready= too")
            if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or not max_wait > 0:
                raise ValueError(f"max_wait must be a positive number of seconds or None, got {max_wait!r}")
        if gc_freeze is not None and not isinstance(gc_freeze, bool):
            raise TypeError(f"gc_freeze must be True, False or None, got {gc_freeze!r}")
        self.min_ready, self.max_wait = min_ready, max_wait
        self.gc_freeze = len(envs) >= GC_FREEZE_MIN_ENVS if gc_freeze is None else gc_freeze
        self._gc_held = False
        self.envs = list(envs)
        first = self.envs[0]
        self._obs_leaves = flatten_space(first.observation_space, "observation", one_hot=one_hot)
        self._act_leaves = flatten_space(first.action_space, "action", one_hot=one_hot)
        n = len(self.envs)
        self.spec = EnvSpec(
            torch.Size([n]),
            observation={leaf.key: leaf.spec for leaf in self._obs_leaves},
            action={leaf.key: leaf.spec for leaf in self._act_leaves},
        )
        self._obs = {k: s.zeros((n,)) for k, s in self.spec.observation.items()}
        # How shape errors name each env.
        self._src = [
            Source(f"{type(e).__name__} (AsyncEnvPool env {i})", "observation_space") for i, e in enumerate(envs)
        ]
        self._reward = torch.zeros(n)
        self._term = torch.zeros(n, dtype=torch.bool)
        self._trunc = torch.zeros(n, dtype=torch.bool)
        # The hot path writes numpy views of these: a fraction of the cost of torch indexing.
        self._flags_np = (self._reward.numpy(), self._term.numpy(), self._trunc.numpy())
        self._row_writer = fast_row_writer(self._obs_leaves, self._obs)
        self._single_action = len(self._act_leaves) == 1 and self._act_leaves[0].path == ()
        self._limit = None if max_concurrency is None or max_concurrency >= n else anyio.Semaphore(max_concurrency)
        self._timeout, self._on_timeout, self._on_error = step_timeout, on_timeout, on_error
        self.counters = PoolCounters()

    def _write(self, i: int, obs: Any, method: str) -> None:
        if self._row_writer is None or not self._row_writer(i, obs):
            write_row(self._obs_leaves, obs, self._obs, i, self._src[i], method)

    def _actions(self, action: dict[NestedKey, Any]) -> Sequence[Any]:
        """Every env's gymnasium action, converted for the whole batch at once where possible."""
        if self._single_action:
            batch = to_gym_action(self._act_leaves, action, single=False)
            if batch.ndim == 1 and batch.dtype.kind in "iu":
                return batch.tolist()  # Discrete: plain ints, as gymnasium envs get them
            return list(batch.copy())  # rows of a private copy: an env may keep its action
        n = len(next(iter(action.values())))  # the whole pool, or the envs a barrier-free step serves
        return [to_gym_action(self._act_leaves, {k: v[i] for k, v in action.items()}, single=True) for i in range(n)]

    async def _reset_row(self, i: int, seed: int | None = None) -> None:
        """Reset env ``i``; its observation lands in row ``i`` of the pool's arrays."""
        try:
            if self._limit is None:
                obs, _ = await self.envs[i].reset(seed=seed)
            else:
                async with self._limit:
                    obs, _ = await self.envs[i].reset(seed=seed)
        except Exception as exc:
            _name(exc, i, "reset()")
            raise
        self._write(i, obs, "reset()")

    async def _reset_arrays(self, mask: torch.Tensor | None, seeds: Sequence[int] | None) -> dict[NestedKey, Any]:
        if self.gc_freeze and not self._gc_held:
            _gcfreeze.hold()
            self._gc_held = True
        rows = range(len(self.envs)) if mask is None else mask.nonzero().flatten().tolist()

        async def one(i: int) -> None:
            await self._reset_row(i, None if seeds is None else int(seeds[i]))

        await each(one, rows, self.cancel_grace)
        return self._obs

    async def _step_one(self, i: int, act: Any) -> Any:
        """The env's step result, or ``None`` if it timed out and ``on_timeout="truncate"``."""
        env = self.envs[i]
        if self._timeout is None:
            return await env.step(act)
        with anyio.move_on_after(self._timeout):
            return await env.step(act)
        if self._on_timeout == "error":
            raise EnvTimeoutError(
                f"AsyncEnvPool env {i} ({type(env).__name__}) did not finish step() within step_timeout="
                f"{self._timeout}s; raise step_timeout, or pass on_timeout='truncate' to end its episode there"
            )
        self.counters.timeouts += 1
        return None

    async def _step_row(self, i: int, act: Any) -> None:
        """Step env ``i``; its results land in row ``i`` of the pool's arrays."""
        try:
            if self._limit is None:
                out = await self._step_one(i, act)
            else:
                async with self._limit:
                    out = await self._step_one(i, act)
        except Exception as exc:
            if self._on_error == "raise" or isinstance(exc, EnvTimeoutError):
                _name(exc, i, "step()")
                raise
            self.counters.errors += 1
            out = None
        reward_np, term_np, trunc_np = self._flags_np
        if out is None:  # failed or timed out: a truncation, the last observation kept
            reward_np[i], term_np[i], trunc_np[i] = 0.0, False, True
            return
        obs, reward, term, trunc, _ = out
        self._write(i, obs, "step()")
        reward_np[i], term_np[i], trunc_np[i] = float(reward), bool(term), bool(trunc)

    async def _step_arrays(self, action: dict[NestedKey, torch.Tensor]) -> StepArrays:
        acts = self._actions(action)

        async def one(i: int) -> None:
            await self._step_row(i, acts[i])

        await each(one, range(len(self.envs)), self.cancel_grace)
        return self._obs, self._reward, self._term, self._trunc

    async def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        """Reset the selected envs concurrently; see `BatchedEnv.reset`."""
        obs = await self._reset_arrays(mask, seeds)
        return TensorDict({k: v.clone() for k, v in obs.items()}, batch_size=self.spec.batch_size)

    async def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step every env concurrently; see `BatchedEnv.step`."""
        obs, reward, term, trunc = await self._step_arrays({k: action.get(k) for k in self.spec.action})
        data = {k: v.clone() for k, v in obs.items()}
        data.update(reward=reward.clone(), terminated=term.clone(), truncated=trunc.clone())
        return TensorDict(data, batch_size=self.spec.batch_size)

    def close(self) -> None:
        """Call each env's synchronous ``close()`` if it has one; end the pool's `gc_freeze`."""
        if self._gc_held:
            self._gc_held = False
            _gcfreeze.release()
        for env in self.envs:
            close = getattr(env, "close", None)
            if close is not None and not _is_coro_fn(close):
                close()

    async def aclose(self) -> None:
        """Await every env's ``aclose()`` (or coroutine ``close()``) concurrently, then `close`.

        An env that holds a connection closes it here, on the event loop that opened it.
        """
        closers = [getattr(env, "aclose", None) or getattr(env, "close", None) for env in self.envs]
        rows = [i for i, c in enumerate(closers) if c is not None and _is_coro_fn(c)]

        async def one(i: int) -> None:
            await closers[i]()  # type: ignore[misc]

        try:
            await each(one, rows)
        finally:
            self.close()


def _name(exc: BaseException, i: int, method: str) -> None:
    """Say which env raised; ``except`` clauses still see the env's own exception type."""
    note_once(exc, f"raised by AsyncEnvPool env {i} in {method}")


def _is_coro_fn(fn: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)

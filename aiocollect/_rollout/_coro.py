"""Coroutine policies: a policy that is a client of something else, awaited once per env and step.

A policy may live outside the process: a model server, an LLM endpoint. Then it is a
coroutine function, ``async def policy(td) -> td_or_action``, called with one env's
observation (an unbatched ``TensorDict`` that also holds the env's index under
``("collector", "env_id")``, for clients that keep a session per env) and returning the action: a ``TensorDict`` (or
mapping) holding the action keys, or the action tensor itself when the env has one action
key. Each ready env gets its own call, as its own task: at most ``max_concurrency`` in flight,
each within ``timeout`` seconds. An env's step starts as soon as its own answer arrives, on
whatever kind of env the pool holds (coroutine envs on the loop, threads, processes).

A call that raises, returns something that is not an action for the env, or runs past
``timeout`` stops collection with an error naming the env (the policy's own exception, with
a note; `InferenceError` for a timeout or a wrong answer). As with coroutine envs, a call
that raises (``on_error="reset"``) or runs late (``on_timeout="truncate"``) may instead end
that env's trajectory: no frame is made up for the action that never came. The env's last
recorded frame, if still in the batch being filled, is marked truncated (its next
observation is where the trajectory stops), and the env is reset and asked again. An answer
of the wrong shape always stops collection (a bug, not a failure of the service), and so
does a run of failures with no answer between them (``max_in_a_row``: an outage, not a
hiccup), so collection never spins without frames.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import numpy as np
import torch

from .._core._errors import InferenceError, note_once

__all__ = [
    "CoroutinePolicy",
    "act_now",
    "end_trajectory",
    "fill_with_coroutine_policy",
    "is_coroutine_policy",
    "put_row",
]


def is_coroutine_policy(policy: Any) -> bool:
    """``async def`` functions and objects whose ``__call__`` is one."""
    if policy is None:
        return False
    return inspect.iscoroutinefunction(policy) or inspect.iscoroutinefunction(getattr(policy, "__call__", None))  # noqa: B004


class _Late(InferenceError):
    """A call past its timeout (an `InferenceError`, told apart for ``on_timeout``)."""


class CoroutinePolicy:
    """A coroutine policy with its concurrency limit, per-call timeout and failure rules.

    Args:
        fn: The coroutine function.
        max_concurrency: At most this many calls in flight; ``None``: one per env.
        timeout: Seconds one call may take; ``None``: no limit.
        on_timeout: ``"error"`` or ``"truncate"`` (end the env's trajectory and reset it).
        on_error: ``"raise"`` or ``"reset"`` (the same, for a call that raised).
        max_in_a_row: Forgiven failures in a row, with no answer between them, that stop
            collection all the same.
    """

    def __init__(self, fn: Callable[..., Any], max_concurrency: int | None, timeout: float | None,
                 on_timeout: str = "error", on_error: str = "raise", max_in_a_row: int = 8) -> None:  # fmt: skip
        self.fn, self.timeout = fn, timeout
        self.max_concurrency = max_concurrency
        self.on_timeout, self.on_error, self.max_in_a_row = on_timeout, on_error, max_in_a_row
        self._limit: anyio.Semaphore | None = None
        self.version = 0
        self.errors = self.timeouts = 0  # forgiven failures, for stats()
        self._in_a_row = 0

    def forgives(self, exc: Exception) -> bool:
        """Whether the rules turn this failed call into the end of a trajectory (counted).

        Raises:
            InferenceError: ``max_in_a_row`` failures in a row, from ``exc``.
        """
        late = isinstance(exc, _Late)
        if (self.on_timeout != "truncate") if late else (self.on_error != "reset"):
            return False
        if late:
            self.timeouts += 1
        else:
            self.errors += 1
        self._in_a_row += 1
        if self._in_a_row >= self.max_in_a_row:
            raise InferenceError(
                f"the coroutine policy failed {self._in_a_row} calls in a row with no answer between them; "
                "on_policy_error='reset' and on_policy_timeout='truncate' forgive failures, not an outage: check "
                "the service (its last failure is chained)"
            ) from exc
        return True

    def answered(self) -> None:
        self._in_a_row = 0

    def limiter(self) -> anyio.Semaphore | None:
        if self._limit is None and self.max_concurrency is not None:
            self._limit = anyio.Semaphore(self.max_concurrency)  # made on the loop that uses it
        return self._limit

    async def call(self, request: Any, env: int) -> Any:
        limit = self.limiter()
        if limit is None:
            return await self._timed(request, env)
        async with limit:
            return await self._timed(request, env)

    async def _timed(self, request: Any, env: int) -> Any:
        if self.timeout is None:
            return await self.fn(request)
        with anyio.move_on_after(self.timeout):
            return await self.fn(request)
        raise _Late(
            f"the coroutine policy did not answer env {env} within policy_timeout={self.timeout}s; raise "
            "policy_timeout, make the policy answer sooner, or pass on_policy_timeout='truncate' to end the env's "
            "trajectory there"
        )


async def fill_with_coroutine_policy(rollout: Any) -> None:
    """`StreamRollout._fill` for a coroutine policy: one call per ready env, each starting its env's step.

    While the batch fills, an env whose step was just recorded is asked for its next action
    at once (`act_now`), without a round through this loop; once the batch is full, envs wait
    in ``ready`` until the next batch is asked for (collection stays on demand).
    """
    rollout.collecting = True
    try:
        while rollout.filled < rollout.N:
            rollout._raise_error()
            if not rollout.ready:
                await rollout._wait(1)
                continue
            rows, rollout.ready = rollout.ready, []
            act_now(rollout, rows)
    finally:
        rollout.collecting = False


def act_now(rollout: Any, rows: list[int]) -> None:
    """Start one policy call (then the env's step) per row, as tasks of the rollout's owner."""
    rollout.in_flight += len(rows)
    for i in rows:
        rollout._spawn_task(_act_one, rollout, i)


def _numpy_views(tensors: dict[Any, torch.Tensor]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for k, v in tensors.items():
        try:
            out[k] = v.numpy()
        except TypeError:  # bfloat16: write the tensor itself
            out[k] = v
    return out


async def _act_one(rollout: Any, i: int) -> None:
    policy = rollout.coro_policy
    assert policy is not None
    started = False
    try:
        pend, cur = rollout.pend_np, rollout.cur_np
        if pend is None:
            pend = rollout.pend_np = _numpy_views(rollout.pend)
            cur = rollout.cur_np = _numpy_views(rollout.cur)
        obs = {}
        for k, v in cur.items():
            # The env's observation stays put until its step is recorded: what it is given is set now.
            pend[k][i] = v[i]
            obs[k] = torch.from_numpy(v[i].copy()) if isinstance(v, np.ndarray) else v[i].clone()
        # With the env's index, for clients that keep a session per env (built without
        # TensorDict's checks: these entries are unbatched tensors by construction).
        request = _request(obs, torch.scalar_tensor(i, dtype=torch.int64))
        try:
            answer = await policy.call(request, i)
        except Exception as exc:
            if not policy.forgives(exc):
                raise
            end_trajectory(rollout, i)
            started = True
            rollout._restart(i)  # takes over the in-flight count
            return
        policy.answered()
        action = _action_of(answer, rollout, i)
        for k, a in action.items():
            put_row(pend[k], i, a)
        rollout.pend_version[i] = policy.version
        rollout.pend_traj[i] = rollout.traj[i]
        started = True
        rollout._dispatch_one(i, action)  # the step's task (or shard queue) takes over the in-flight count
    except Exception as exc:
        note_once(exc, f"raised by the coroutine policy for env {i}")
        if rollout.error is None:
            rollout.error = exc
    finally:
        if not started:
            rollout.in_flight -= 1
            if rollout._until is not None:
                rollout._poke()


def end_trajectory(rollout: Any, i: int) -> None:
    """Mark env ``i``'s last frame truncated if it is in the batch being filled and of its current trajectory.

    A frame already delivered cannot be changed: with ``set_truncated=True`` it was marked
    as its batch's last frame of that env anyway; the next trajectory has a new id.
    """
    if rollout.store is None:
        return
    _, _, trunc_col, done_col, env_col, traj_col, _ = rollout._cols
    f = rollout.filled
    mine = np.flatnonzero((env_col[:f] == i) & (traj_col[:f] == rollout.traj[i]))
    if len(mine):
        trunc_col[mine[-1]] = done_col[mine[-1]] = True


_SCALAR = torch.Size([])


def put_row(dst: Any, i: int, a: torch.Tensor) -> None:
    """``dst[i] = a`` for a numpy array (or a tensor, for dtypes numpy lacks) and one env's action."""
    if not isinstance(dst, np.ndarray):
        dst[i] = a
    elif a.ndim:
        dst[i] = a.numpy()
    else:  # a scalar action (discrete spaces): no array round trip
        dst[i] = a.item()


def _request(obs: dict[Any, torch.Tensor], env_id: torch.Tensor) -> Any:
    from tensordict import TensorDict

    new = getattr(TensorDict, "_new_unsafe", None)
    if new is None:  # pragma: no cover - a tensordict without it
        request = TensorDict(obs, batch_size=[])
        request["collector", "env_id"] = env_id
        return request
    return new({**obs, "collector": new({"env_id": env_id}, batch_size=_SCALAR)}, batch_size=_SCALAR)


def _action_of(answer: Any, rollout: Any, i: int) -> dict[Any, torch.Tensor]:
    """The action tensors in ``answer``, checked against the env's action spec."""
    from tensordict import TensorDictBase

    specs = rollout.spec.action
    if type(answer) is torch.Tensor and len(specs) == 1:
        ((key, spec),) = specs.items()
        if answer.shape == spec.shape and answer.dtype == spec.dtype and not answer.is_cuda:  # the common answer
            return {key: answer}
        answer = {key: answer}
    if not isinstance(answer, (Mapping, TensorDictBase)):
        raise InferenceError(
            f"the coroutine policy answered env {i} with {type(answer).__name__}; return a TensorDict or mapping "
            f"holding {list(specs)}, or the action tensor"
        )
    out: dict[Any, torch.Tensor] = {}
    for k, spec in specs.items():
        value = answer.get(k)
        if not isinstance(value, torch.Tensor):
            value = None if value is None else torch.as_tensor(value)
        if value is None or tuple(value.shape) != tuple(spec.shape):
            got = "nothing" if value is None else f"shape {tuple(value.shape)}"
            raise InferenceError(
                f"the coroutine policy answered env {i} with {got} for {k!r}; the env's action spec wants shape "
                f"{tuple(spec.shape)} (one env's action, unbatched)"
            )
        out[k] = value.to(device="cpu", dtype=spec.dtype)  # a model on a GPU may answer there
    return out

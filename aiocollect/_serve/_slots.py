"""`SlotPool`: single envs stepped in shards (threads or env-only processes) for central inference.

The pool is what `AsyncBatchedCollector` gives the barrier-free rollout: an
`AsyncBatchedEnv` of ``n`` independent envs split into shards. The rollout runs the policy
on whichever envs are ready, writes their actions into the pool's ``act`` rows and hands
each shard the rows it owns (`step_shard`); the shard steps those envs one by one and
returns. A shard's rows that become ready while it is busy go in its next call, so a
shard's thread (or process) never waits for another shard, and no env waits for a
lock-step batch. Where the shards run is the backend's business (`ThreadShards` here,
`ProcessShards` in ``_procs``); the pool and the rollout do not branch on it.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import anyio
import anyio.to_thread
import numpy as np
import torch

from .._core._threads import ThreadLane
from .._envs import _gcfreeze
from .._envs._base import AsyncBatchedEnv
from .._envs._gym_spaces import Leaf, flatten_space
from .._envs._pool import GC_FREEZE_MIN_ENVS, PoolCounters
from .._envs._specs import EnvSpec, NestedKey
from .._rollout._shards import ShardedStreamRollout
from ._shard import EnvShard, SlotArrays, slot_layout

__all__ = ["ShardBackend", "SlotPool", "ThreadShards", "env_name", "shard_rows", "spec_from_spaces"]


class ShardBackend(Protocol):
    """Where a `SlotPool`'s shards run: one small interface for threads and processes."""

    arrays: SlotArrays
    shards: list[np.ndarray]  # each shard's env ids (rows of the arrays)

    async def reset(self, seeds: Sequence[int | None] | None) -> None: ...

    async def step(self, shard: int, rows: np.ndarray) -> None: ...

    async def reset_rows(self, shard: int, rows: np.ndarray) -> None: ...

    async def aclose(self, timeout: float) -> None: ...

    def close_now(self) -> None: ...


def shard_rows(n: int, envs_per_worker: int | None, default_shards: int) -> list[np.ndarray]:
    """Split env ids ``0..n-1`` into contiguous shards of ``envs_per_worker`` (default: ``default_shards`` shards)."""
    per = envs_per_worker if envs_per_worker is not None else math.ceil(n / max(1, min(n, default_shards)))
    return [np.arange(lo, min(n, lo + per)) for lo in range(0, n, per)]


def default_shard_count() -> int:
    """One shard per core the process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def env_name(env: Any, i: int) -> str:
    """``"CartPole-v1 (env 3)"``: the gymnasium id (else the class) and the env's index."""
    name = (
        getattr(env, "label", None)  # a wrapped TorchRL env's own class
        or getattr(getattr(env, "spec", None), "id", None)
        or type(getattr(env, "unwrapped", env)).__name__
    )
    return f"{name} (env {i})"


def spec_from_spaces(obs_space: Any, act_space: Any, n: int) -> tuple[EnvSpec, list[Leaf], list[Leaf]]:
    """The pool's spec (batch ``[n]``) and the flattened spaces of one env."""
    obs_leaves = flatten_space(obs_space, "observation")
    act_leaves = flatten_space(act_space, "action")
    spec = EnvSpec(
        torch.Size([n]),
        observation={leaf.key: leaf.spec for leaf in obs_leaves},
        action={leaf.key: leaf.spec for leaf in act_leaves},
    )
    return spec, obs_leaves, act_leaves


def check_same_spaces(envs: Sequence[tuple[int, Any, Any]]) -> None:
    """Every env must have the first one's spaces: the pool stores them in one set of arrays."""
    first_id, obs0, act0 = envs[0]
    for i, obs, act in envs[1:]:
        if obs != obs0 or act != act0:
            raise ValueError(
                f"every env of an AsyncBatchedCollector must have the same spaces; env {i} has observation_space "
                f"{obs} and action_space {act}, env {first_id} has {obs0} and {act0}: make the factories build "
                "envs of one kind"
            )


class SlotPool(AsyncBatchedEnv):
    """``n`` single envs in shards, stepped independently; see the module docstring.

    Args:
        backend: The shards (threads or processes), already started.
        spec: The pool's spec (batch ``[n]``).
        min_ready: The policy runs when this many envs are ready (or ``max_wait`` after the first).
        max_ready: At most this many envs per policy call.
        max_wait: Seconds to wait for ``min_ready`` envs; ``None``: no limit.
        gc_freeze: Freeze the cyclic garbage collector from the first reset to `close`
            (`AsyncEnvPool`'s ``gc_freeze``); ``None``: for pools of at least 256 envs.
    """

    rollout_class = ShardedStreamRollout

    def __init__(
        self,
        backend: ShardBackend,
        spec: EnvSpec,
        *,
        min_ready: int,
        max_ready: int | None,
        max_wait: float | None,
        gc_freeze: bool | None = None,
    ) -> None:
        self.backend, self.spec = backend, spec
        self.min_ready, self.max_ready, self.max_wait = min_ready, max_ready, max_wait
        arrays = backend.arrays
        self._obs, self._reset_obs, self.act = arrays["obs"], arrays["reset_obs"], arrays["act"]
        flags = arrays["flags"]
        self._flags_np = tuple(flags[f].numpy() for f in ("reward", "terminated", "truncated"))
        self.shards = backend.shards
        self.shard_of = np.zeros(spec.numel, np.int64)
        for s, rows in enumerate(self.shards):
            self.shard_of[rows] = s
        self.counters = PoolCounters()  # envs here raise; none is turned into a truncation
        #: ``step(rows)`` callable on any thread (one shard of thread-safe envs), else None.
        self.inline_step = getattr(backend, "inline_step", None)
        #: Shards the collector's thread drives itself (send / wait / finish), else None.
        self.sync_shards = backend if getattr(backend, "drives_sync", False) else None
        self._closed = False
        self.gc_freeze = spec.numel >= GC_FREEZE_MIN_ENVS if gc_freeze is None else gc_freeze
        self._gc_held = False

    async def _reset_arrays(self, mask: torch.Tensor | None, seeds: Sequence[int] | None) -> dict[NestedKey, Any]:
        if mask is not None and not bool(mask.all()):
            raise NotImplementedError("a SlotPool resets all its envs at once (the rollout resets the rest itself)")
        if self.gc_freeze and not self._gc_held:
            _gcfreeze.hold()
            self._gc_held = True
        await self.backend.reset(None if seeds is None else [int(s) for s in seeds])
        return self._obs

    async def step_shard(self, shard: int, rows: np.ndarray) -> None:
        """Step the envs of ``rows`` (all in ``shard``) with their rows of ``act``."""
        await self.backend.step(shard, rows)

    async def reset_rows(self, shard: int, rows: np.ndarray) -> None:
        """Reset the envs of ``rows`` (all in ``shard``); their first observations land in ``obs``."""
        await self.backend.reset_rows(shard, rows)

    async def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> Any:
        """Reset every env; see `BatchedEnv.reset`."""
        from tensordict import TensorDict

        obs = await self._reset_arrays(mask, seeds)
        return TensorDict({k: v.clone() for k, v in obs.items()}, batch_size=self.spec.batch_size)

    async def step(self, action: Any) -> Any:
        """Step every env once (all shards concurrently); envs whose episode ended are reset."""
        from tensordict import TensorDict

        for k, v in self.act.items():
            v.copy_(action.get(k))

        async def one(s: int) -> None:
            await self.backend.step(s, self.shards[s])

        async with anyio.create_task_group() as tg:
            for s in range(len(self.shards)):
                tg.start_soon(one, s)
        data: dict[Any, torch.Tensor] = {k: v.clone() for k, v in self._obs.items()}
        reward, term, trunc = self._flags_np
        data.update(reward=torch.from_numpy(reward.copy()), terminated=torch.from_numpy(term.copy()),
                    truncated=torch.from_numpy(trunc.copy()))  # fmt: skip
        return TensorDict(data, batch_size=self.spec.batch_size)

    async def aclose(self) -> None:
        """Close every env where it lives, within ``cancel_grace`` seconds (then abandon or kill)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.backend.aclose(self.cancel_grace)
        finally:
            self._release_gc()

    def close(self) -> None:
        """Close at once, without waiting (threads still busy are abandoned; processes killed)."""
        if not self._closed:
            self._closed = True
            try:
                self.backend.close_now()
            finally:
                self._release_gc()

    def _release_gc(self) -> None:
        if self._gc_held:
            self._gc_held = False
            _gcfreeze.release()


class ThreadShards:
    """Shards on threads of this process: each shard's envs step on its own `ThreadLane`.

    Args:
        envs: The built envs, in env-id order.
        shards: Each shard's env ids.
        names: How errors name each env.
    """

    def __init__(self, envs: Sequence[Any], shards: list[np.ndarray], names: list[str]) -> None:
        obs_space, act_space = envs[0].observation_space, envs[0].action_space
        check_same_spaces([(i, e.observation_space, e.action_space) for i, e in enumerate(envs)])
        self.spec, obs_leaves, act_leaves = spec_from_spaces(obs_space, act_space, len(envs))
        self.arrays = allocate_slots(self.spec)
        self.shards = shards
        self._lanes = [ThreadLane(f"aiocollect env shard {s}") for s in range(len(shards))]
        # One shard steps on the collector's own thread (see ShardedStreamRollout._fill).
        self._shards = [
            EnvShard({int(i): envs[i] for i in rows}, obs_leaves, act_leaves, self.arrays,
                     {int(i): names[i] for i in rows})
            for rows in shards
        ]  # fmt: skip
        self.inline_step = self._shards[0].step if len(shards) == 1 else None
        # Several shards are driven from the collector's thread (send / wait / finish), each
        # stepping on a thread of its own; the lanes serve resets and closes.
        self.drives_sync = len(shards) > 1
        self._steppers = _Steppers(self._shards) if self.drives_sync else None

    def send(self, shard: int, rows: np.ndarray) -> None:
        """Start shard ``shard``'s step of ``rows`` on its stepping thread."""
        assert self._steppers is not None
        self._steppers.send(shard, rows)

    def wait(self, timeout: float) -> list[int]:
        """The shards whose step ended, waiting at most ``timeout`` seconds for one."""
        assert self._steppers is not None
        return self._steppers.wait(timeout)

    def finish(self, shard: int) -> None:
        """Raise what shard ``shard``'s step raised, if anything."""
        assert self._steppers is not None
        self._steppers.finish(shard)

    async def reset(self, seeds: Sequence[int | None] | None) -> None:
        async def one(s: int) -> None:
            rows = self.shards[s].tolist()
            await self._lanes[s].run(self._shards[s].reset, rows, None if seeds is None else [seeds[i] for i in rows])

        async with anyio.create_task_group() as tg:
            for s in range(len(self.shards)):
                tg.start_soon(one, s)

    async def step(self, shard: int, rows: np.ndarray) -> None:
        await self._lanes[shard].run(self._shards[shard].step, rows)

    async def reset_rows(self, shard: int, rows: np.ndarray) -> None:
        await self._lanes[shard].run(self._shards[shard].reset, rows.tolist(), None)

    async def aclose(self, timeout: float) -> None:
        error: BaseException | None = None
        with anyio.move_on_after(timeout):
            if self._steppers is not None:  # no env closes while one of its steps runs
                await anyio.to_thread.run_sync(self._steppers.stop, timeout, abandon_on_cancel=True)
            for lane, shard in zip(self._lanes, self._shards, strict=True):
                try:
                    await lane.run_final(shard.close)  # after the step in progress, if any
                except Exception as exc:
                    error = error or exc
                await lane.aclose()
        for lane in self._lanes:
            lane.close()
        if error is not None:
            raise error

    def close_now(self) -> None:
        busy = self._steppers.stop(0.0) if self._steppers is not None else set()
        for s, (lane, shard) in enumerate(zip(self._lanes, self._shards, strict=True)):
            if lane.idle and s not in busy:
                shard.close()
            lane.close()


class _Steppers:
    """One daemon thread per shard stepping the rows it is sent; ends are reported on one queue."""

    def __init__(self, shards: list[EnvShard]) -> None:
        self._shards = shards
        self._jobs: list[queue.SimpleQueue[np.ndarray | None]] = [queue.SimpleQueue() for _ in shards]
        self._ended: queue.SimpleQueue[tuple[int, BaseException | None]] = queue.SimpleQueue()
        self._errors: list[BaseException | None] = [None] * len(shards)
        self._threads: list[threading.Thread | None] = [None] * len(shards)

    def _serve(self, s: int) -> None:
        shard, jobs = self._shards[s], self._jobs[s]
        while (rows := jobs.get()) is not None:
            error: BaseException | None = None
            try:
                shard.step(rows)
            except BaseException as exc:  # raised by finish() on the collector's thread
                error = exc
            self._ended.put((s, error))

    def send(self, s: int, rows: np.ndarray) -> None:
        thread = self._threads[s]
        if thread is None:
            thread = self._threads[s] = threading.Thread(
                target=self._serve, args=(s,), name=f"aiocollect env shard {s} steps", daemon=True
            )
            thread.start()
        self._jobs[s].put(rows)

    def wait(self, timeout: float) -> list[int]:
        try:
            ended = [self._ended.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                ended.append(self._ended.get_nowait())
            except queue.Empty:
                break
        for s, error in ended:
            self._errors[s] = error
        return [s for s, _ in ended]

    def finish(self, s: int) -> None:
        error, self._errors[s] = self._errors[s], None
        if error is not None:
            raise error

    def stop(self, timeout: float) -> set[int]:
        """End the threads (after the step each may be running, for at most ``timeout`` s in all);
        returns the shards still stepping."""
        for jobs in self._jobs:
            jobs.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        return {s for s, t in enumerate(self._threads) if t is not None and t.is_alive()}


def allocate_slots(spec: EnvSpec, make: Callable[..., Any] | None = None) -> SlotArrays:
    """Zeroed slot arrays for ``spec``'s envs (``make(layout)``: views of a shared block instead)."""
    from ._shard import group_views

    layout = slot_layout(spec.numel, spec.observation, spec.action)
    if make is not None:
        return group_views(make(layout))
    return group_views({key: torch.zeros(shape, dtype=dtype) for key, shape, dtype in layout})

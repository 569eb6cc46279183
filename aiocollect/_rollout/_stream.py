"""Barrier-free collection: an `AsyncEnvPool`'s envs step independently (``min_ready=``).

Lock-step batches wait for the slowest env at every step. Here each env steps as soon as its
previous step returns: the policy runs on whichever observations are ready (at least
``min_ready`` of them, or what is ready after ``max_wait`` seconds), and each env's step is
its own task. A frame is recorded when its step returns.

Batch layout: a flat ``[frames_per_batch]`` batch with lock-step's keys plus
``("collector", "env_id")``. Frames are grouped by env (env 0's first), in time order within
each env, so every trajectory is a contiguous run: ``split_trajectories`` (and
``split_trajs=True``) cut them exactly, and value estimators can run on the split rows. An
env has at most one step in flight and no step is in flight between batches: the batch
ends when its last frame's step returns, and the next one starts from every env's current
observation (its trajectory goes on).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import torch

from .._core._seeding import TrajCounter
from .._envs._specs import ArraySpec, NestedKey
from ._arrays import next_key as _nxt
from ._policy import PolicyAdapter

if TYPE_CHECKING:
    from tensordict import TensorDict

    from .._envs._pool import AsyncEnvPool

__all__ = ["StreamRollout", "barrier_free_rollout"]

ENV_ID, TRAJ = ("collector", "env_id"), ("collector", "traj_ids")
VERSION, WORKER = ("collector", "policy_version"), ("collector", "worker_id")
FLAGS = ("reward", "terminated", "truncated", "done")


def barrier_free_rollout(
    pool: Any, policy: PolicyAdapter, cfg: Any, counter: TrajCounter, generator: torch.Generator, stop: threading.Event
) -> StreamRollout:
    """The rollout of a barrier-free pool, after checking the collector's options suit it."""
    for name, value, default in (("max_frames_per_traj", cfg.max_frames_per_traj, None),
                                 ("set_truncated", cfg.set_truncated, False),
                                 ("reset_at_each_iter", cfg.reset_at_each_iter, False)):  # fmt: skip
        if value != default:
            raise ValueError(
                f"{name}={value!r} is not supported with a barrier-free AsyncEnvPool (min_ready=): its envs "
                f"have no common time step; drop {name}, or drop min_ready for lock-step batches"
            )
    return StreamRollout(pool, policy, frames=cfg.frames_per_batch, traj_counter=counter, generator=generator,
                         storing_device=cfg.storing_device, stop=stop)  # fmt: skip


class StreamRollout:
    """Collects ``frames`` frames per batch from a barrier-free ``pool`` with ``policy``.

    It offers what the collector uses of `Rollout` (``acollect``, ``request_reset``,
    ``output_layout``, ``steps_done``), for async envs only; ``buf`` is ``None`` (batches
    are never written straight into a replay buffer's rows).
    """

    buf = None

    def __init__(
        self,
        pool: AsyncEnvPool,
        policy: PolicyAdapter,
        *,
        frames: int,
        traj_counter: TrajCounter,
        generator: torch.Generator,
        storing_device: torch.device | None,
        stop: threading.Event,
        worker_id: int = 0,
    ) -> None:
        self.env, self.policy, self.N = pool, policy, frames
        self.spec = pool.spec
        self.n = pool.spec.numel
        self.B, self.T = (), frames  # a flat batch of T frames
        self.counter, self.generator, self.storing_device = traj_counter, generator, storing_device
        self.stop, self.worker_id = stop, worker_id
        self.min_ready, self.max_wait = pool.min_ready or 1, pool.max_wait
        self.needs_reset, self.seeds = True, None
        self.steps_done = 0
        self.traj = np.zeros(self.n, np.int64)
        self.cur: dict[NestedKey, torch.Tensor] = {}  # each env's observation awaiting an action
        self.pend: dict[NestedKey, torch.Tensor] = {}  # per env: what its step in flight was given
        self.pend_version = np.zeros(self.n, np.int64)
        self.pend_traj = np.zeros(self.n, np.int64)
        self.specs: dict[NestedKey, ArraySpec] | None = None
        self.extras: list[NestedKey] = []

    # -- what the collector calls -------------------------------------------------------------
    def request_reset(self, seeds: list[int] | None = None) -> None:
        """Reset every env before the next batch (with one seed per env, if given)."""
        self.needs_reset = True
        if seeds is not None:
            self.seeds = seeds

    def output_layout(self) -> list[tuple[Any, tuple[int, ...], torch.dtype]]:
        """Keys, shapes and dtypes of the batches (known after the first batch's dry run)."""
        assert self.specs is not None
        layout = [(k, (self.N, *s.shape), s.dtype) for k, s in self.specs.items()]
        layout += [(_nxt(k), (self.N, *s.shape), s.dtype) for k, s in self.spec.observation.items()]
        layout += [(("next", f), (self.N, 1), torch.float32 if f == "reward" else torch.bool) for f in FLAGS]
        layout += [(f, (self.N, 1), torch.bool) for f in FLAGS[1:]]
        layout += [(k, (self.N,), torch.int64) for k in (ENV_ID, TRAJ, VERSION, WORKER)]
        return layout

    async def acollect(
        self, random: bool, run_sync: Callable[..., Awaitable[Any]], out: dict[Any, torch.Tensor] | None = None
    ) -> TensorDict:
        """Collect one batch of ``frames`` frames; the policy runs via ``run_sync`` (a thread)."""
        from tensordict import TensorDict

        random = random or self.policy.is_random
        if self.needs_reset:
            await self.env._reset_arrays(None, self.seeds)
            self.cur = {k: v.clone() for k, v in self.env._obs.items()}
            self.traj[:] = self.counter.take_np(self.n)
            self.needs_reset, self.seeds = False, None
        if self.specs is None:
            await run_sync(self._learn_layout, random)
        frames = await _Batch(self, random, run_sync).run()
        # Group by env, time order kept within each (a stable sort): trajectories are contiguous.
        order = torch.from_numpy(np.argsort(frames[ENV_ID].numpy(), kind="stable"))
        dev = self.storing_device
        data = {k: v.index_select(0, order) for k, v in frames.items()}
        if out is not None:
            for k, v in data.items():
                out[k].copy_(v)
            data = out
        elif dev is not None:
            data = {k: v.to(dev) for k, v in data.items()}
        return TensorDict(data, batch_size=[self.N], device=dev)

    # -- internals ----------------------------------------------------------------------------
    def _learn_layout(self, random: bool) -> None:
        specs: dict[NestedKey, ArraySpec] = dict(self.spec.observation)
        specs.update(self.spec.action)
        if not random and not self.policy.is_random:
            one = {k: v[:1] for k, v in self.cur.items()}
            with torch.no_grad():
                first = self.policy(one, [])
            self.policy.check(first, (1,))
            nxt = {_nxt(k) for k in self.spec.observation}
            self.extras = [k for k in first if k not in self.spec.action and k not in nxt]
            specs.update({k: ArraySpec(tuple(first[k].shape[1:]), first[k].dtype) for k in self.extras})
        self.specs = specs
        self.pend = {k: s.zeros((self.n,)) for k, s in specs.items()}

    def _act(self, rows: list[int], random: bool) -> dict[NestedKey, torch.Tensor]:
        """Run the policy on the ready envs' observations; remember what each env is given."""
        if self.stop.is_set():
            from ._rollout import Interrupted

            raise Interrupted
        idx = torch.tensor(rows, dtype=torch.int64)
        obs = {k: v.index_select(0, idx) for k, v in self.cur.items()}
        versions: list[int] = []
        if random:
            versions.append(self.policy.version)
            out = {k: s.sample(self.generator, (len(rows),)) for k, s in self.spec.action.items()}
        else:
            with torch.no_grad():
                out = self.policy(obs, versions)
        pend = self.pend
        for k in self.spec.observation:
            pend[k].index_copy_(0, idx, obs[k])
        for k in (*self.spec.action, *self.extras):
            if k in out:
                pend[k].index_copy_(0, idx, out[k].to(pend[k].dtype))
        self.pend_version[rows] = versions[0]
        self.pend_traj[rows] = self.traj[rows]
        return {k: out[k] for k in self.spec.action}


class _Batch:
    """One batch: dispatch ready envs, record each frame as its step returns, until full."""

    def __init__(self, ro: StreamRollout, random: bool, run_sync: Callable[..., Awaitable[Any]]) -> None:
        self.ro, self.random, self.run_sync = ro, random, run_sync
        n, N = ro.n, ro.N
        self.frames = {k: torch.zeros((N, *t.shape[1:]), dtype=t.dtype) for k, t in ro.pend.items()}
        for k, s in ro.spec.observation.items():
            self.frames[_nxt(k)] = s.zeros((N,))
        for f in FLAGS:
            self.frames[("next", f)] = torch.zeros((N, 1), dtype=torch.float32 if f == "reward" else torch.bool)
        for f in FLAGS[1:]:
            self.frames[f] = torch.zeros((N, 1), dtype=torch.bool)
        for k in (ENV_ID, TRAJ, VERSION):
            self.frames[k] = torch.zeros(N, dtype=torch.int64)
        self.frames[WORKER] = torch.full((N,), ro.worker_id, dtype=torch.int64)
        self.ready = list(range(n))  # every env has an observation waiting for an action
        self.filled = self.in_flight = 0
        self.changed = anyio.Event()

    async def run(self) -> dict[Any, torch.Tensor]:
        ro, N = self.ro, self.ro.N
        async with anyio.create_task_group() as tg:
            while self.filled < N:
                room = N - self.filled - self.in_flight  # frames not yet promised to a step
                want = min(ro.min_ready, room, ro.n)
                if room <= 0 or len(self.ready) < want:
                    await self._wait(want if room > 0 else math.inf)
                    if room <= 0 or not self.ready:
                        continue
                rows, self.ready = self.ready[:room], self.ready[room:]
                actions = await self.run_sync(ro._act, rows, self.random)
                acts = ro.env._actions(actions)
                self.in_flight += len(rows)
                for j, i in enumerate(rows):
                    tg.start_soon(self._step, i, acts[j])
        return self.frames

    async def _wait(self, want: float) -> None:
        """Until ``want`` envs are ready, or ``max_wait`` seconds after the first one was."""
        ro = self.ro
        while len(self.ready) < want and self.filled < ro.N:
            if self.ready and ro.max_wait is not None:
                with anyio.move_on_after(ro.max_wait):
                    while len(self.ready) < want and self.filled < ro.N:
                        await self.changed.wait()
                return
            await self.changed.wait()

    async def _step(self, i: int, act: Any) -> None:
        ro, pool = self.ro, self.ro.env
        await pool._step_row(i, act)
        f, frames = self.filled, self.frames
        self.filled += 1
        for k, v in ro.pend.items():
            frames[k][f] = v[i]
        for k in ro.spec.observation:
            frames[_nxt(k)][f] = pool._obs[k][i]
        reward, term, trunc = float(pool._reward[i]), bool(pool._term[i]), bool(pool._trunc[i])
        frames["next", "reward"][f] = reward
        frames["next", "terminated"][f] = term
        frames["next", "truncated"][f] = trunc
        frames["next", "done"][f] = term or trunc
        frames[ENV_ID][f], frames[TRAJ][f], frames[VERSION][f] = i, int(ro.pend_traj[i]), int(ro.pend_version[i])
        ro.steps_done += 1
        if term or trunc:
            await pool._reset_row(i)
            ro.traj[i] = ro.counter.take_one()
        for k in ro.spec.observation:
            ro.cur[k][i] = pool._obs[k][i]
        self.in_flight -= 1
        self.ready.append(i)
        self.changed.set()
        self.changed = anyio.Event()

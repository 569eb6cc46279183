"""Barrier-free collection from a sharded pool (central inference): one task per shard, not per step.

A sharded pool (`SlotPool`, built by `AsyncBatchedCollector`) holds single envs that step in
shards, each a thread or an env-only process. Three ways to drive them, by what the shards
allow: one env thread steps on the collector's own thread, taking turns with the policy
(`_cycle_inline`); several env threads or env processes are driven from the collector's thread
too, which sends each free shard its rows and waits for whichever answers first
(`_cycle_sync`); with a coroutine policy, one task per shard on the event loop, as follows. The policy
runs, as in `StreamRollout`, on whichever envs are ready; their actions go into the pool's
``act`` rows (on the policy's thread) and their ids into their shard's queue. Each shard is
served by one long-lived task that hands its shard every queued row at once and, when the
shard returns, records the frames of all of them with a few array operations. Per env step, the event loop pays for
appending an int to a list: everything else is per shard call. A shard never waits for
another, and an env never waits for a lock-step batch.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import anyio
import numpy as np
import torch

from .._envs._specs import NestedKey
from ._coro import put_row
from ._stream import ENV_ID, TRAJ, VERSION, StreamRollout

__all__ = ["ShardedStreamRollout"]


class ShardedStreamRollout(StreamRollout):
    """`StreamRollout` for a pool whose envs step in shards (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool: Any = cast(Any, self.env)  # a SlotPool (a layer above this one): shards, act, step_shard
        shards = self.pool.shards
        self.pending: list[list[int]] = [[] for _ in shards]  # rows queued for each shard's next call
        self.restarts: list[list[int]] = [[] for _ in shards]  # rows to reset before it (see _restart)
        self._kicks: list[Any] = [None] * len(shards)  # an anyio.Event while the shard's task waits
        self._shards_started = False
        self._busy: list[np.ndarray | None] = [None] * len(shards)  # each shard's rows in its call in progress
        self._vcols: tuple[Any, ...] = ()
        self._reset_src = [_np(self.pool._reset_obs[k]) for k in self.spec.observation]
        self._act_np = {k: _np(v) for k, v in self.pool.act.items()}

    # -- stepping -----------------------------------------------------------------------------
    def _store_actions(self, idx: torch.Tensor | None, out: dict[NestedKey, torch.Tensor]) -> None:
        for k, dst in self.pool.act.items():
            src = out[k].to(device=dst.device, dtype=dst.dtype)
            if idx is None:
                dst.copy_(src)
            else:
                dst.index_copy_(0, idx, src)

    def needs_tasks(self) -> bool:
        # Env threads or processes are driven from the collector's thread: no task needed.
        return self.coro_policy is not None or (self.pool.inline_step is None and self.pool.sync_shards is None)

    async def _fill(self, random: bool, run_sync: Callable[..., Awaitable[Any]]) -> None:
        if self.coro_policy is None and self.pool.sync_shards is not None:
            while self.filled < self.N:
                self._raise_error()
                await run_sync(self._cycle_sync, random)
            return
        if self.pool.inline_step is None or self.coro_policy is not None:
            await super()._fill(random, run_sync)
            return
        # One shard whose envs may step on any thread: policy and steps alternate on the
        # collector's thread until the batch is full, as in Collector. Two threads taking
        # turns would only add two thread wake-ups per step (about 100 us each on a VM).
        while self.filled < self.N:
            self._raise_error()
            await run_sync(self._cycle_inline, random)

    def _cycle_inline(self, random: bool) -> None:
        """On the collector's thread: act on the ready envs, step them, record, until the batch is full."""
        step = self.pool.inline_step
        while self.filled < self.N:
            take = self.max_ready
            if take is None or len(self.ready) <= take:
                rows, self.ready = self.ready, []
            else:
                rows, self.ready = self.ready[:take], self.ready[take:]
            self._act(rows, random)
            arr = np.array(rows, dtype=np.int64)
            step(arr)
            self._record(arr)

    def _dispatch(self, rows: list[int], actions: dict[NestedKey, torch.Tensor]) -> None:
        self._start_shards()
        shard_of = self.pool.shard_of
        kicked = set()
        for i in rows:
            s = int(shard_of[i])
            self.pending[s].append(i)
            kicked.add(s)
        for s in kicked:
            self._kick(s)

    def _dispatch_one(self, i: int, action: dict[NestedKey, torch.Tensor]) -> None:
        for k, dst in self._act_np.items():
            put_row(dst, i, action[k])
        self._start_shards()
        s = int(self.pool.shard_of[i])
        self.pending[s].append(i)
        self._kick(s)

    def _restart(self, i: int) -> None:
        # Through the shard's task: a shard takes one call at a time (one pipe, one lane).
        self._start_shards()
        s = int(self.pool.shard_of[i])
        self.restarts[s].append(i)
        self._kick(s)

    def _start_shards(self) -> None:
        if not self._shards_started:
            self._shards_started = True
            for s in range(len(self.pending)):
                self._spawn_task(self._serve_shard, s)

    def _kick(self, s: int) -> None:
        event = self._kicks[s]
        if event is not None:
            self._kicks[s] = None
            event.set()

    async def _serve_shard(self, s: int) -> None:
        """Shard ``s``'s task: reset the rows to restart, step every queued row in one call, record, repeat."""
        pending, restarts, pool = self.pending[s], self.restarts[s], self.pool
        while True:
            while not pending and not restarts:
                event = self._kicks[s] = anyio.Event()
                await event.wait()
            queue, restart = (restarts, True) if restarts else (pending, False)
            rows = np.array(queue, dtype=np.int64)
            queue.clear()
            try:
                if restart:
                    await pool.reset_rows(s, rows)
                    self._started_over(rows)
                else:
                    await pool.step_shard(s, rows)
                    self._record(rows)
            except Exception as exc:  # raised by the collector's next acollect, not in its task group
                if self.error is None:
                    self.error = exc
                return
            finally:
                self.in_flight -= len(rows)
                if self._until is not None:
                    self._poke()

    def _started_over(self, rows: np.ndarray) -> None:
        """Envs just reset (their first observations are in the pool's ``obs``): new trajectories, ready."""
        for dst, src in self._cur_copies:
            dst[rows] = src[rows]
        self.traj[rows] = self.counter.take_np(len(rows))
        self._ready_again(rows.tolist())

    # -- driving env processes from the collector's thread --------------------------------------
    async def _drain(self, run_sync: Callable[..., Awaitable[Any]]) -> None:
        if self.pool.sync_shards is None or not any(rows is not None for rows in self._busy):
            await super()._drain(run_sync)
            return
        await run_sync(self._drain_sync)

    def _drain_sync(self) -> None:
        """Collect the replies of the shard calls in progress (before every env is reset)."""
        while any(rows is not None for rows in self._busy):
            self._collect_replies(0.1)

    def _cycle_sync(self, random: bool) -> None:
        """The barrier-free loop on the collector's thread, for shards it drives itself (processes).

        Ready envs get their actions once ``min_ready`` of them are ready, or ``max_wait``
        seconds after the first was, or at once when no step is in progress; each shard is
        sent its rows as soon as it is free; replies are waited for with a bounded wait (the
        stop flag is checked between two).
        """
        from ._rollout import Interrupted

        shard_of, pending, busy = self.pool.shard_of, self.pending, self._busy
        first = None  # when the oldest ready env became ready
        while self.filled < self.N:
            if self.stop.is_set():
                raise Interrupted
            now = time.perf_counter()
            if self.ready:
                first = now if first is None else first
                idle = all(rows is None for rows in busy)
                late = self.max_wait is not None and now - first >= self.max_wait
                if len(self.ready) >= self.min_ready or idle or late:
                    take = self.max_ready
                    if take is None or len(self.ready) <= take:
                        rows, self.ready = self.ready, []
                    else:
                        rows, self.ready = self.ready[:take], self.ready[take:]
                    first = None if not self.ready else now
                    self._act(rows, random)
                    self.in_flight += len(rows)
                    for i in rows:
                        pending[shard_of[i]].append(i)
                    for s, queued in enumerate(pending):
                        if queued and busy[s] is None:
                            self._send(s)
                    continue
                timeout = 0.1 if self.max_wait is None else max(0.0, self.max_wait - (now - first))
            else:
                timeout = 0.1
            self._collect_replies(min(timeout, 0.1))

    def _send(self, s: int) -> None:
        rows = np.array(self.pending[s], dtype=np.int64)
        self.pending[s].clear()
        self._busy[s] = rows
        self.pool.sync_shards.send(s, rows)

    def _collect_replies(self, timeout: float) -> None:
        shards = self.pool.sync_shards
        for s in shards.wait(timeout):
            rows, self._busy[s] = self._busy[s], None
            try:
                shards.finish(s)
            finally:
                self.in_flight -= len(rows)
            self._record(rows)
            if self.pending[s]:
                self._send(s)

    # -- recording ----------------------------------------------------------------------------
    def _bind(self, store: dict[Any, torch.Tensor]) -> None:
        super()._bind(store)
        self._vcols = tuple(store[k].view(-1).numpy() for k in (("next", "reward"), ("next", "terminated"),
                            ("next", "truncated"), ("next", "done"), ENV_ID, TRAJ, VERSION))  # fmt: skip

    def _record(self, rows: np.ndarray) -> None:
        """The frames of ``rows``' steps, appended in one go; the envs that ended start a new trajectory."""
        m = len(rows)
        f = self.filled
        self.filled = f + m
        sl = slice(f, f + m)
        for dst, src in self._copies:
            dst[sl] = src[rows]
        reward, term_np, trunc_np = self.env._flags_np
        term, trunc = term_np[rows], trunc_np[rows]
        done = term | trunc
        r_col, term_col, trunc_col, done_col, env_col, traj_col, version_col = self._vcols
        r_col[sl], term_col[sl], trunc_col[sl], done_col[sl] = reward[rows], term, trunc, done
        env_col[sl], traj_col[sl], version_col[sl] = rows, self.pend_traj[rows], self.pend_version[rows]
        self.steps_done += m
        ended = rows[done]
        for (dst, src), reset in zip(self._cur_copies, self._reset_src, strict=True):
            dst[rows] = src[rows]
            if len(ended):
                dst[ended] = reset[ended]
        if len(ended):
            self.traj[ended] = self.counter.take_np(len(ended))
        self._ready_again(rows.tolist())


def _np(t: torch.Tensor) -> Any:
    try:
        return t.numpy()
    except TypeError:  # bfloat16: index the tensor itself
        return t

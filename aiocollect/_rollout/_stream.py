"""Barrier-free collection: an `AsyncEnvPool`'s envs step independently (``min_ready=``).

Lock-step batches wait for the slowest env at every step. Here each env steps as soon as its
previous step returns: the policy runs on whichever observations are ready (at least
``min_ready`` of them, or what is ready after ``max_wait`` seconds), and each env's step is
its own task. A frame is recorded when its step returns.

Batch layout: a flat ``[frames_per_batch]`` batch with lock-step's keys plus
``("collector", "env_id")``. Frames are grouped by env (env 0's first), in time order within
each env, so every trajectory is a contiguous run: ``split_trajectories`` (and
``split_trajs=True``) cut them exactly. With ``set_truncated=True`` each env's last frame in
the batch is marked truncated (its trajectory goes on in the next batch, as in lock-step),
so value estimators such as TorchRL's GAE can run on the flat batch or the split rows. An
env has at most one step in flight. A batch ends as soon as it holds its frames: steps still
in flight go on (owned by a task of the collector's task group), and their frames open the
next batch, so a straggler never holds a batch back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np
import torch

from .._core._seeding import TrajCounter
from .._envs._gather import cancel_and_wait, open_task_group
from .._envs._specs import ArraySpec, NestedKey
from ._arrays import next_key as _nxt
from ._arrays import numpy_pair as _pair
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
    if cfg.max_frames_per_traj is not None:
        raise ValueError(
            f"max_frames_per_traj={cfg.max_frames_per_traj!r} is not supported with a barrier-free AsyncEnvPool "
            "(min_ready=): its envs have no common time step; drop max_frames_per_traj, or drop min_ready for "
            "lock-step batches"
        )
    kind: type[StreamRollout] = getattr(pool, "rollout_class", StreamRollout)  # a sharded pool names its own
    return kind(pool, policy, frames=cfg.frames_per_batch, traj_counter=counter, generator=generator,
                storing_device=cfg.storing_device, stop=stop, shutdown_timeout=cfg.shutdown_timeout,
                set_truncated=cfg.set_truncated, reset_at_each_iter=cfg.reset_at_each_iter)  # fmt: skip


class StreamRollout:
    """Collects ``frames`` frames per batch from a barrier-free ``pool`` with ``policy``.

    It offers what the collector uses of `Rollout` (``acollect``, ``request_reset``,
    ``output_layout``, ``steps_done``), for async envs only; ``buf`` is ``None`` (batches
    are never written straight into a replay buffer's rows).
    """

    buf = None
    #: ``(new key, key)`` pairs: batches also hold each key's column under the new key
    #: (`AsyncBatchedCollector` repeats TorchRL's ``"env_index"`` and ``"policy_version"``).
    aliases: tuple[tuple[Any, Any], ...] = ()
    #: A coroutine policy (`CoroutinePolicy`), awaited per env instead of ``policy``.
    coro_policy: Any = None

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
        shutdown_timeout: float = 10.0,
        set_truncated: bool = False,
        reset_at_each_iter: bool = False,
    ) -> None:
        self.env, self.policy, self.N = pool, policy, frames
        self.spec = pool.spec
        self.n = pool.spec.numel
        self.B, self.T = (), frames  # a flat batch of T frames
        self.counter, self.generator, self.storing_device = traj_counter, generator, storing_device
        self.stop, self.worker_id, self.set_truncated = stop, worker_id, set_truncated
        self.min_ready, self.max_wait = pool.min_ready or 1, pool.max_wait
        self.max_ready: int | None = getattr(pool, "max_ready", None)
        self.reset_at_each_iter = reset_at_each_iter
        self.needs_reset = True
        self.seeds: list[int] | None = None
        self.steps_done = 0
        self.traj = np.zeros(self.n, np.int64)
        self._all_rows = list(range(self.n))
        self.collecting = False  # a coroutine policy's batch is filling (see _coro.act_now)
        self.pend_np: dict[NestedKey, Any] | None = None  # numpy views of pend, made on first use
        self.cur_np: dict[NestedKey, Any] | None = None  # ... and of cur (with pend_np)
        # A policy on a GPU reads the ready envs' observations from pinned host memory.
        device = getattr(policy, "device", None)
        self._cuda = device is not None and device.type == "cuda"
        self._pinned = (
            {k: torch.empty((self.n, *s.shape), dtype=s.dtype).pin_memory() for k, s in pool.spec.observation.items()}
            if self._cuda
            else None
        )
        self.cur: dict[NestedKey, torch.Tensor] = {}  # each env's observation awaiting an action
        self.pend: dict[NestedKey, torch.Tensor] = {}  # per env: what its step in flight was given
        self.pend_version = np.zeros(self.n, np.int64)
        self.pend_traj = np.zeros(self.n, np.int64)
        self.specs: dict[NestedKey, ArraySpec] | None = None
        self.extras: list[NestedKey] = []
        # Cross-batch state: env steps outlive their batch, so a step in flight when a batch
        # fills goes on, and its frame opens the next one. Each step is a plain task of the
        # running library (an anyio task and cancel scope cost ~10x more per step), owned by
        # a task of the collector's task group: under asyncio (and uvloop) `_keep`, which
        # cancels and awaits them at shutdown, bounded; under trio `_keep_group`'s nursery.
        self.spawn: Callable[..., Any] | None = None
        self.shutdown_timeout = shutdown_timeout
        self.ready: list[int] = []  # envs whose observation awaits an action
        self.in_flight = 0
        self.store: dict[Any, torch.Tensor] | None = None
        self.filled = 0
        self.error: BaseException | None = None
        self._until: Callable[[], bool] | None = None  # what acollect waits for, and its event
        self._event: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping: Any = None  # an anyio.Event once the steps have an owner
        self._nursery: Any = None  # `_keep_group`'s, outside asyncio
        self._copies: list[tuple[Any, Any]] = []  # (batch column, per-env source) pairs, see _bind
        self._cur_copies: list[tuple[Any, Any]] = []
        self._cols: tuple[Any, ...] = ()

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
        layout += [(new, (self.N,), torch.int64) for new, _ in self.aliases]
        return layout

    async def acollect(
        self, random: bool, run_sync: Callable[..., Awaitable[Any]], out: dict[Any, torch.Tensor] | None = None
    ) -> TensorDict:
        """Collect one batch of ``frames`` frames; the policy runs via ``run_sync`` (a thread).

        Steps still in flight when the batch is full go on: their frames open the next batch.
        """
        from tensordict import TensorDict

        random = random or self.policy.is_random
        if self.needs_tasks() and self._stopping is None:
            assert self.spawn is not None, "the collector sets spawn (its task group's start_soon) first"
            self._stopping = anyio.Event()
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:  # trio
                self._loop = None
                opened = anyio.Event()
                self.spawn(self._keep_group, opened)
                await opened.wait()
            else:
                self.spawn(self._keep)
        if self.reset_at_each_iter:
            self.needs_reset = True
        if self.needs_reset:
            await self._drain(run_sync)  # their frames are kept; then every env starts afresh
            self._raise_error()
            await self.env._reset_arrays(None, self.seeds)
            self.cur = {k: self._host(v.clone()) for k, v in self.env._obs.items()}
            self.pend_np = self.cur_np = None
            self._cur_copies = [_pair(self.cur[k], v) for k, v in self.env._obs.items()]
            self.traj[:] = self.counter.take_np(self.n)
            self.ready = list(range(self.n))
            self.needs_reset, self.seeds = False, None
        if self.specs is None:
            await run_sync(self._learn_layout, random)
            self.pend_np = self.cur_np = None
        if self.store is None:
            self.store = self._allocate()
            self._bind(self.store)
        N = self.N
        await self._fill(random, run_sync)
        store = self.store
        # Group by env, time order kept within each (a stable sort): trajectories are contiguous.
        order = torch.from_numpy(np.argsort(store[ENV_ID][:N].numpy(), kind="stable"))
        data = {k: v[:N].index_select(0, order) for k, v in store.items()}
        if self.set_truncated:
            # Each env's last frame in the batch ends its run here, as the batch's last step
            # does in lock-step: value estimators then never bootstrap across two envs' runs.
            env = data[ENV_ID]
            last = torch.ones(N, dtype=torch.bool)
            last[:-1] = env[1:] != env[:-1]
            data["next", "truncated"][last] = True
            data["next", "done"][last] = True
        for new, key in self.aliases:
            data[new] = data[key]
        extra = self.filled - N  # frames of steps that returned after the batch was full
        for v in store.values():
            v[:extra] = v[N : N + extra].clone()
        self.filled = extra
        dev = self.storing_device
        if out is not None:
            for k, v in data.items():
                out[k].copy_(v)
            data = out
        elif dev is not None:
            data = {k: v.to(dev) for k, v in data.items()}
        return TensorDict(data, batch_size=[N], device=dev)

    async def _drain(self, run_sync: Callable[..., Awaitable[Any]]) -> None:
        """Until no env step is in flight."""
        await self._wait_for(lambda: not self.in_flight)

    async def _fill(self, random: bool, run_sync: Callable[..., Awaitable[Any]]) -> None:
        """Run the policy on ready envs and start their steps until the batch holds its frames."""
        if self.coro_policy is not None:
            from ._coro import fill_with_coroutine_policy

            await fill_with_coroutine_policy(self)
            return
        N = self.N
        while self.filled < N:
            self._raise_error()
            if len(self.ready) < self.min_ready:
                await self._wait(self.min_ready)  # returns early at max_wait, or with the batch full
                if not self.ready or self.filled >= N:
                    continue
            take = self.max_ready
            if take is None or len(self.ready) <= take:
                rows, self.ready = self.ready, []
            else:  # the longest-waiting envs first
                rows, self.ready = self.ready[:take], self.ready[take:]
            actions = await run_sync(self._act, rows, random)
            self.in_flight += len(rows)
            self._dispatch(rows, actions)

    def cancel_steps(self) -> None:
        """Cancel every env step in flight (the collector is shutting down); loop thread only."""
        if self._stopping is not None:
            self._stopping.set()
        for task in list(self._tasks):
            task.cancel()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def needs_tasks(self) -> bool:
        """Whether env steps run as tasks of the collector's task group (then ``async with`` is needed)."""
        return True

    # -- internals ----------------------------------------------------------------------------
    def _spawn_task(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` as a plain task owned by `_keep` (asyncio) or `_keep_group` (trio)."""
        loop = self._loop
        if loop is not None:
            task = loop.create_task(fn(*args))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._nursery.start_soon(fn, *args)

    def _dispatch(self, rows: list[int], actions: dict[NestedKey, torch.Tensor]) -> None:
        """Start the steps of ``rows`` with their ``actions``: one task per env."""
        acts = self.env._actions(actions)
        for j, i in enumerate(rows):
            self._spawn_task(self._owned, self._step_and_record, i, acts[j])

    def _dispatch_one(self, i: int, action: dict[NestedKey, torch.Tensor]) -> None:
        """Start env ``i``'s step with its (unbatched) ``action``."""
        act = self.env._actions({k: v.unsqueeze(0) for k, v in action.items()})[0]
        self._spawn_task(self._owned, self._step_and_record, i, act)

    def _raise_error(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    async def _wait_for(self, until: Callable[[], bool]) -> None:
        """Until ``until()`` holds; steps check it as they end, so an event is made per wait, not per step."""
        while not until():
            self._until, self._event = until, anyio.Event()
            try:
                await self._event.wait()
            finally:
                self._until = self._event = None

    def _poke(self) -> None:
        if self._until():  # type: ignore[misc]  # only called while acollect waits
            self._event.set()

    async def _wait(self, want: int) -> None:
        """Until ``want`` envs are ready, or ``max_wait`` seconds after the first one was."""

        def enough() -> bool:
            return len(self.ready) >= want or self.error is not None or self.filled >= self.N

        def first() -> bool:
            return bool(self.ready) or enough()

        if self.max_wait is None:
            await self._wait_for(enough)
            return
        await self._wait_for(first)
        with anyio.move_on_after(self.max_wait):
            await self._wait_for(enough)

    async def _keep(self) -> None:
        """Owns the steps' plain tasks (asyncio): at shutdown they are cancelled and awaited, bounded."""
        try:
            await self._stopping.wait()
        finally:
            await cancel_and_wait(
                list(self._tasks), self.shutdown_timeout, "env step(s) of a barrier-free AsyncEnvPool"
            )

    async def _keep_group(self, opened: anyio.Event) -> None:
        """Owns the steps under trio: a nursery, cancelled at shutdown (trio cannot leave a task behind)."""
        async with open_task_group() as nursery:
            self._nursery = nursery
            opened.set()
            await self._stopping.wait()
            nursery.cancel_scope.cancel()

    def _allocate(self) -> dict[Any, torch.Tensor]:
        """Frame rows: a batch and, after it, room for the steps in flight when it fills."""
        rows = self.N + self.n
        store = {k: torch.zeros((rows, *t.shape[1:]), dtype=t.dtype) for k, t in self.pend.items()}
        for k, s in self.spec.observation.items():
            store[_nxt(k)] = s.zeros((rows,))
        for f in FLAGS:
            store[("next", f)] = torch.zeros((rows, 1), dtype=torch.float32 if f == "reward" else torch.bool)
        for f in FLAGS[1:]:
            store[f] = torch.zeros((rows, 1), dtype=torch.bool)
        for k in (ENV_ID, TRAJ, VERSION):
            store[k] = torch.zeros(rows, dtype=torch.int64)
        store[WORKER] = torch.full((rows,), self.worker_id, dtype=torch.int64)
        return store

    def _bind(self, store: dict[Any, torch.Tensor]) -> None:
        """Pair each batch column with where a step's frame comes from (numpy views: per-row
        writes through them cost a fraction of torch indexing)."""
        pool = self.env
        self._copies = [_pair(store[k], v) for k, v in self.pend.items()]
        self._copies += [_pair(store[_nxt(k)], pool._obs[k]) for k in self.spec.observation]
        self._cols = tuple(store[k].numpy() for k in (("next", "reward"), ("next", "terminated"),
                           ("next", "truncated"), ("next", "done"), ENV_ID, TRAJ, VERSION))  # fmt: skip

    async def _owned(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """``fn(*args)`` as one unit of the in-flight count; its error is kept for `acollect`."""
        try:
            await fn(*args)
        except Exception as exc:  # raised by the collector's next acollect, not in its task group
            if self.error is None:
                self.error = exc
        finally:
            self.in_flight -= 1
            if self._until is not None:
                self._poke()

    def _restart(self, i: int) -> None:
        """Start env ``i`` afresh, as a task that takes over its unit of the in-flight count
        (its policy call failed and was forgiven: see ``_coro``)."""
        self._spawn_task(self._owned, self._start_over, i)

    async def _start_over(self, i: int) -> None:
        """Reset env ``i``, open its next trajectory, and make it ready for an action."""
        await self.env._reset_row(i)
        self.traj[i] = self.counter.take_one()
        for dst, src in self._cur_copies:
            dst[i] = src[i]
        self._ready_again([i])

    async def _step_and_record(self, i: int, act: Any) -> None:
        """Env ``i``'s step (a task, see `_owned`): records its frame, resets the env if done."""
        pool = self.env
        await pool._step_row(i, act)
        f = self.filled
        self.filled += 1
        for dst, src in self._copies:
            dst[f] = src[i]
        reward, term_np, trunc_np = pool._flags_np
        term, trunc = bool(term_np[i]), bool(trunc_np[i])
        r_col, term_col, trunc_col, done_col, env_col, traj_col, version_col = self._cols
        r_col[f], term_col[f], trunc_col[f], done_col[f] = reward[i], term, trunc, term or trunc
        env_col[f], traj_col[f], version_col[f] = i, self.pend_traj[i], self.pend_version[i]
        self.steps_done += 1
        if term or trunc:
            await self._start_over(i)
            return
        for dst, src in self._cur_copies:
            dst[i] = src[i]
        self._ready_again([i])

    def _ready_again(self, rows: list[int]) -> None:
        """Envs whose step was recorded: a coroutine policy asks for their next action at once
        while the batch fills; otherwise they wait for the next policy call."""
        if self.collecting and self.filled < self.N:
            from ._coro import act_now

            act_now(self, rows)
        else:
            self.ready.extend(rows)

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

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` in pinned memory when the policy is on a GPU (its copies there can then be asynchronous)."""
        return t.pin_memory() if self._cuda else t

    def _store_actions(self, idx: torch.Tensor | None, out: dict[NestedKey, torch.Tensor]) -> None:
        """Where a pool takes its actions from arrays (a sharded pool), put them there (``idx``: rows; None: all)."""

    def _act(self, rows: list[int], random: bool) -> dict[NestedKey, torch.Tensor]:
        """Run the policy on the ready envs' observations; remember what each env is given."""
        if self.stop.is_set():
            from ._rollout import Interrupted

            raise Interrupted
        n = len(rows)
        # Every env at once, in order (one shard, or a lock-step start): slices, no index ops.
        whole = n == self.n and rows == self._all_rows
        idx = None if whole else torch.tensor(rows, dtype=torch.int64)
        if idx is None:
            obs = dict(self.cur)
        elif self._pinned is not None:  # gathered into pinned memory: the copy to the GPU does not block
            obs = {k: torch.index_select(v, 0, idx, out=self._pinned[k][:n]) for k, v in self.cur.items()}
        else:
            obs = {k: v.index_select(0, idx) for k, v in self.cur.items()}
        versions: list[int] = []
        if random:
            versions.append(self.policy.version)
            out = {k: s.sample(self.generator, (n,)) for k, s in self.spec.action.items()}
        else:
            with torch.no_grad():
                out = self.policy(obs, versions)
            if self._cuda:  # the actions go to host arrays; this copy also ends the use of the pinned rows
                out = {k: v.cpu() for k, v in out.items()}
        pend = self.pend
        for k in self.spec.observation:
            if idx is None:
                pend[k].copy_(obs[k])
            else:
                pend[k].index_copy_(0, idx, obs[k])
        for k in (*self.spec.action, *self.extras):
            if k in out:
                if idx is None:
                    pend[k].copy_(out[k])
                else:
                    pend[k].index_copy_(0, idx, out[k].to(pend[k].dtype))
        if whole:
            self.pend_version[:] = versions[0]
            self.pend_traj[:] = self.traj
        else:
            sel = np.asarray(rows)
            self.pend_version[sel] = versions[0]
            self.pend_traj[sel] = self.traj[sel]
        self._store_actions(idx, out)
        return {k: out[k] for k in self.spec.action}

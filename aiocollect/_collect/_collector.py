"""Collector: the asyncio-native, in-process collector."""

from __future__ import annotations

import math
import time
from typing import Any

import anyio
import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._core._errors import warn_user
from .._core._loops import in_event_loop
from .._core._seeding import SeedPlan, check_seed
from .._core._threads import ThreadLane, to_thread
from .._envs._base import AsyncBatchedEnv
from .._rollout._config import make_env, validate_config
from .._rollout._policy import PolicyAdapter
from .._rollout._rollout import Rollout, TrajCounter
from .._rollout._stream import StreamRollout, barrier_free_rollout
from ._lifecycle import CollectorLifecycle

__all__ = ["Collector"]


class Collector(CollectorLifecycle):
    """Collect batches of experience from environments in this process, without blocking the loop.

    Env stepping and policy inference run in a worker thread (or, for an `AsyncBatchedEnv`,
    on the event loop with the policy in a thread), so the event loop stays responsive.
    Batches are TensorDicts of shape ``[*env_batch, T]`` in TorchRL's layout (see the docs'
    batch layout page).

    ``async with`` is the deterministic form: it builds the env, owns a producer task and
    closes everything on exit, whether by exhaustion, ``break``, an exception or
    cancellation. Iterating without ``async with`` also works; the env is built lazily and
    closed when iteration ends or `aclose` is called (a barrier-free `AsyncEnvPool`, whose
    steps belong to the task group that ``async with`` opens, needs ``async with``).
    Batches are collected on demand: with the default ``max_queued_batches=0`` the next
    batch starts only when you ask for it, so an on-policy trainer always collects with the
    weights it just trained.

    Args:
        create_env_fn: A gymnasium env id, a ``gymnasium.Env``/``VectorEnv``, a `BatchedEnv`
            or `AsyncBatchedEnv`, or a callable returning one (called with
            ``create_env_kwargs``).
        policy: ``None`` (random actions), an ``nn.Module`` mapping observations to actions,
            or a TensorDict callable (e.g. a ``TensorDictModule``) that writes ``"action"``.
        frames_per_batch: Frames per batch, rounded up to a multiple of the env batch size.
        total_frames: Frame budget; ``-1`` for endless collection.
        max_frames_per_traj: Truncate (and reset) trajectories after this many steps; adds
            ``step_count``. ``None`` or ``<= 0`` disables it.
        init_random_frames: Collect this many frames (in whole batches) with random actions
            before the policy is used.
        reset_at_each_iter: Reset every env at the start of every batch.
        postproc: A callable applied to each batch (after ``split_trajs``).
        split_trajs: Split each batch into zero-padded trajectories (`split_trajectories`).
        exploration_type: The ``tensordict.nn.InteractionType`` the policy runs under.
        reset_when_done: Must be True (kept for TorchRL compatibility).
        device: Default for ``env_device``, ``policy_device`` and ``storing_device``.
        env_device: Device actions are moved to before stepping the env.
        policy_device: Device the policy runs on; the policy is copied there only if needed.
        storing_device: Device of the yielded batches.
        create_env_kwargs: Keyword arguments for ``create_env_fn``.
        set_truncated: Mark the last step of every batch as truncated (the env is not reset).
        track_traj_ids: Write ``("collector", "traj_ids")``.
        max_queued_batches: How many batches may be collected ahead of the consumer.
        shutdown_timeout: Seconds teardown waits for an env step in progress to return.
        replay_buffer: A `ReplayBuffer` (or its blocking twin) to write batches into instead
            of yielding them: iteration then yields ``None`` per batch written, and `start`
            collects in the background. ``init_random_frames`` then counts the buffer's
            ``write_count``.
        extend_buffer: With a replay buffer, ``True`` writes whole batches; ``False`` writes
            each time step's frames as its own insert, in time order (TorchRL's per-step
            ``add``; no ``postproc``/``split_trajs``).
        trajs_per_batch: Yield batches of this many complete trajectories instead of
            fixed-size batches (unfinished episodes carry over; with a replay buffer, only
            complete episodes are written, as flat runs of frames).
        traj_format: ``"padded"`` (default: ``[N, max_len]`` with ``("collector", "mask")``)
            or ``"cat"`` (trajectories concatenated along one flat dim).
        trajs_per_write: With a replay buffer: complete trajectories per ``extend`` (default 1).

    Raises:
        TypeError: An argument has the wrong type (raised before any env is built).
        ValueError: An argument has a wrong value (raised before any env is built).

    Examples:
        >>> import anyio
        >>> from aiocollect import Collector
        >>> async def main():
        ...     async with Collector("CartPole-v1", frames_per_batch=64, total_frames=128) as c:
        ...         return [batch.shape for batch in [b async for b in c]]
        >>> anyio.run(main)
        [torch.Size([64]), torch.Size([64])]
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool | None = None,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        reset_when_done: bool = True,
        device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        storing_device: Any = None,
        create_env_kwargs: dict[str, Any] | None = None,
        set_truncated: bool = False,
        track_traj_ids: bool = True,
        max_queued_batches: int = 0,
        shutdown_timeout: float = 10.0,
        replay_buffer: Any = None,
        extend_buffer: bool = True,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
    ) -> None:
        self._cfg = validate_config(
            create_env_fn=create_env_fn, policy=policy, frames_per_batch=frames_per_batch,
            total_frames=total_frames, max_frames_per_traj=max_frames_per_traj,
            init_random_frames=init_random_frames, reset_at_each_iter=reset_at_each_iter,
            postproc=postproc, split_trajs=split_trajs, exploration_type=exploration_type,
            reset_when_done=reset_when_done, device=device, env_device=env_device,
            policy_device=policy_device, storing_device=storing_device,
            create_env_kwargs=create_env_kwargs, set_truncated=set_truncated,
            track_traj_ids=track_traj_ids, max_queued_batches=max_queued_batches,
            shutdown_timeout=shutdown_timeout,
        )  # fmt: skip
        cfg = self._cfg
        self._policy = PolicyAdapter(policy, policy_device=cfg.policy_device, exploration_type=cfg.exploration_type)
        self._counter = TrajCounter()
        self._generator = torch.Generator()
        self._generator.seed()
        self._seed_plan: SeedPlan | None = None
        self._lane = ThreadLane()
        self._env: Any = None
        self._rollout: Rollout | StreamRollout | None = None
        self._layout_checked = False
        self._init_lifecycle(
            cfg.total_frames, cfg.frames_per_batch, cfg.max_queued_batches, replay_buffer,
            trajs_per_batch=trajs_per_batch, traj_format=traj_format, trajs_per_write=trajs_per_write,
            extend_buffer=extend_buffer, postprocessing=cfg.split_trajs or cfg.postproc is not None,
        )  # fmt: skip

    # -- lifecycle -----------------------------------------------------------------------------
    def _build(self) -> None:
        cfg = self._cfg
        env = make_env(cfg)
        if isinstance(env, AsyncBatchedEnv):
            env.cancel_grace = cfg.shutdown_timeout
        try:
            self._policy.bind(env.spec, counts_steps=cfg.max_frames_per_traj is not None)
            if getattr(env, "min_ready", None) is not None:
                self._rollout = barrier_free_rollout(env, self._policy, cfg, self._counter, self._generator,
                                                     self._lane.stop)  # fmt: skip
                self._env = env
                self._apply_seeds()
                return
            steps = math.ceil(cfg.frames_per_batch / max(1, env.spec.numel))
            self._rollout = Rollout(
                env, self._policy, steps=steps, traj_counter=self._counter, generator=self._generator,
                max_frames_per_traj=cfg.max_frames_per_traj, set_truncated=cfg.set_truncated,
                reset_at_each_iter=cfg.reset_at_each_iter, env_device=cfg.env_device,
                storing_device=cfg.storing_device, track_traj_ids=cfg.track_traj_ids, stop=self._lane.stop,
            )  # fmt: skip
        except BaseException:
            env.close()
            raise
        self._env = env
        self._apply_seeds()

    async def _start(self) -> None:
        await self._lane.run(self._build)

    def _stop_requested(self) -> None:
        self._lane.stop.set()
        if isinstance(self._rollout, StreamRollout) and in_event_loop():
            self._rollout.cancel_steps()  # env steps in flight are tasks of this collector's task group

    def _activity(self) -> int:
        rollout = self._rollout
        return self._batches + (rollout.steps_done if rollout is not None else 0)

    async def _close_resources(self) -> None:
        env, self._env, self._rollout = self._env, None, None
        timeout = self._cfg.shutdown_timeout
        with anyio.move_on_after(timeout):
            # Queued behind the call in progress (a step sees the stop flag at its next step).
            if isinstance(env, AsyncBatchedEnv):
                await self._lane.run_final(lambda: None)  # the step in progress, if any, ends first
                await env.aclose()  # its connections belong to this event loop
            elif env is not None:
                await self._lane.run_final(env.close)
            await self._lane.aclose()
            return
        self._lane.close()  # its daemon thread is stuck in user code: it cannot keep the process alive
        warn_user(
            f"the env did not finish its {'step and close' if env is not None else 'construction'} within "
            f"shutdown_timeout={timeout}s; it was left running in a daemon thread",
            RuntimeWarning,
        )

    def _close_now(self) -> None:
        env, self._env = self._env, None
        if env is not None and self._lane.idle:
            env.close()
        self._lane.close()

    def _policy_version(self) -> int:
        return self._policy.version

    def _env_counts(self) -> dict[str, Any]:
        counters = getattr(self._rollout.env, "counters", None) if self._rollout is not None else None
        if counters is None:  # an env without them (only an AsyncEnvPool turns failures into truncations)
            return {}
        return {"env_errors": counters.errors, "env_timeouts": counters.timeouts}

    async def _collect_one(self) -> TensorDictBase | None:
        await self._ensure_started()
        rollout = self._rollout
        assert rollout is not None
        random = self._policy.is_random or self._init_random()
        start = time.perf_counter()
        post = self._needs_post()
        if self._batch_rb is not None and self._batch_rb.direct_writes and rollout.buf is not None and not post:
            await self._collect_into_buffer(rollout, random, start)
            return None
        if isinstance(rollout, StreamRollout):
            if self._tg is None:
                # Its env steps outlive a batch, so they need an owner that outlives one too.
                raise RuntimeError(
                    "a barrier-free AsyncEnvPool (min_ready=) is stepped by tasks of the collector's task group; "
                    "iterate the Collector inside 'async with collector:'"
                )
            rollout.spawn = self._tg.start_soon
        if isinstance(rollout.env, AsyncBatchedEnv):
            batch = await rollout.acollect(random, self._lane.run)
        else:
            batch = await self._lane.run(rollout.collect, random)
        # The first batch (which fixes the storage layout) and post-processed batches are
        # copied into a replay buffer; later batches are written straight into its rows.
        return await self._deliver(batch, batch.numel(), start, post=post, run=self._lane.run)

    async def _collect_into_buffer(self, rollout: Rollout, random: bool, start: float) -> None:
        rb = self._batch_rb
        shape = (*rollout.B, rollout.T)
        if not self._layout_checked:
            rb.storage.check_layout([(k, s[len(shape) :], d) for k, s, d in rollout.output_layout()])
            self._layout_checked = True
        res = await rb.reserve(math.prod(shape), shape)
        if self._paused:  # paused while waiting for room: hold nothing, write nothing
            rb.abort(res)
            return None
        self._bg_holding = True
        try:
            views = rb.storage.views(res.pieces, shape)
            if isinstance(rollout.env, AsyncBatchedEnv):
                batch = await rollout.acollect(random, self._lane.run, out=views)
            elif views is not None:  # straight into the buffer's rows, no TensorDict around them
                await self._lane.run(rollout.collect_into, random, views)
            else:
                batch = await self._lane.run(rollout.collect, random, None)
            if views is None:  # the rows wrap around the end of the ring: copy in two pieces
                leaves = batch.items(include_nested=True, leaves_only=True)
                rb.storage.write(res.pieces, {k: v.reshape(res.n, *v.shape[len(shape) :]) for k, v in leaves})
        except BaseException:
            rb.abort(res)
            raise
        finally:
            self._bg_holding = False
        rb.commit(res)
        self._count(res.n, time.perf_counter() - start)

    # -- control -------------------------------------------------------------------------------
    async def update_policy_weights_(self, policy_or_weights: Any = None, *, weights: Any = None) -> None:
        """Bring the collection policy up to date and bump the policy version.

        With no argument the collector's policy copy (if one was made for ``policy_device``)
        is refreshed from the policy you passed in; a policy that was not copied is already
        the live module. Explicit weights (an ``nn.Module``, a state dict or a TensorDict from
        ``TensorDict.from_module``) are loaded into the collection policy. The update never
        lands in the middle of a policy call; frames record the version they were collected
        with in ``("collector", "policy_version")``.

        Args:
            policy_or_weights: Weights to load, or ``None``.
            weights: Same as ``policy_or_weights`` (TorchRL's keyword).
        """
        w = self._weights_argument(policy_or_weights, weights)
        await to_thread(self._policy.update_weights, w)
        if self._rb is not None:
            self._rb.policy_version = self._policy.version

    def set_seed(self, seed: int) -> int:
        """Seed envs, random actions and torch's global RNG; effective from the next batch.

        Env seeds come from ``numpy.random.SeedSequence(seed)``, so envs get independent
        streams; a TorchRL env is seeded with ``seed`` itself (``env.set_seed(seed)``, which
        seeds its sub-envs in turn), as TorchRL's collector does. The envs are reset with
        their seeds at the start of the next batch.

        Args:
            seed: A non-negative int.

        Returns:
            A new seed derived from ``seed``, to seed another collector independently.
        """
        plan = SeedPlan(np.random.SeedSequence(check_seed(seed)), given=seed)
        plan.apply_rngs(self._generator)
        self._seed_plan = plan
        self._apply_seeds()
        return plan.next_seed()

    def _apply_seeds(self) -> None:
        if self._rollout is not None and self._seed_plan is not None:
            as_given = getattr(self._rollout.env, "_seeds_as_given", False)
            self._rollout.request_reset(self._seed_plan.env_seeds(max(1, self._rollout.spec.numel), as_given))
            self._seed_plan = None

    def reset(self) -> None:
        """Reset every env (with fresh trajectory ids) at the start of the next batch.

        In ``trajs_per_batch`` mode, unfinished and queued trajectories are dropped.
        """
        if self._rollout is not None:
            self._rollout.request_reset()
        if self._traj is not None:
            self._traj.reset()

    def _state_module(self) -> torch.nn.Module | None:
        pol = self._policy.policy
        return pol if isinstance(pol, torch.nn.Module) else None

    def _set_policy_version(self, version: int) -> None:
        self._policy.version = version

    def _extra_state(self) -> dict[str, Any]:
        return {"traj_pool": self._counter.next, "generator_state": self._generator.get_state()}

    def _load_extra_state(self, state_dict: dict[str, Any]) -> None:
        self._counter.next = max(self._counter.next, int(state_dict["traj_pool"]))
        self._generator.set_state(state_dict["generator_state"])
        self.reset()  # envs restart from a reset, with fresh trajectory ids

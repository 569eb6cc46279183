"""Collector: the asyncio-native, in-process collector."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
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
from .._envs._torchrl import TorchRLEnv
from .._rollout._config import make_env, validate_config
from .._rollout._factory import make_rollout
from .._rollout._policy import PolicyAdapter, require_materialized
from .._rollout._rollout import Rollout, TrajCounter
from .._rollout._stream import StreamRollout, barrier_free_rollout
from .._workers._updates import restore_version
from ._api import InProcessAttributes
from ._batches import InProcessBatches
from ._dispatch import FrontDoor
from ._inplace import InPlaceWatch
from ._lifecycle import CollectorLifecycle
from ._weight_sync import WeightUpdate, WeightUpdates, check_recv_schemes

__all__ = ["Collector"]


class Collector(
    InProcessAttributes, InProcessBatches, WeightUpdates, CollectorLifecycle, metaclass=FrontDoor, targets="aiocollect"
):
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

    ``Collector(...)`` is also TorchRL 0.14's front door to every collector: ``backend``,
    ``num_collectors``, ``sync`` and ``backend_options`` build `MultiSyncCollector`,
    `MultiAsyncCollector`, `RayCollector`, `RPCCollector` or `DistributedCollector` instead,
    and the object returned keeps that type (it is not a `Collector`). The backend is
    ``backend`` if given, else that of an enclosing ``torchrl.service_backend(...)`` block,
    else ``"process"`` if ``num_collectors`` is given, else ``"direct"`` (this class).
    Every argument is checked before anything is built. Subclasses do not dispatch.

    Args:
        create_env_fn: A gymnasium env id, a ``gymnasium.Env``/``VectorEnv``, a `BatchedEnv`
            or `AsyncBatchedEnv`, or a callable returning one (called with
            ``create_env_kwargs``).
        policy: ``None`` (random actions), an ``nn.Module`` mapping observations to actions,
            or a TensorDict callable (e.g. a ``TensorDictModule``) that writes ``"action"``.
        backend: Which collector to build: ``"direct"`` (this class, one env factory),
            ``"process"`` (alias ``"multiprocessing"``: `MultiSyncCollector` if ``sync`` else
            `MultiAsyncCollector`), ``"ray"`` (`RayCollector`), ``"rpc"`` (`RPCCollector`),
            ``"distributed"`` (`DistributedCollector`) or ``"submitit"`` (`DistributedCollector`
            with ``launcher="submitit"``). ``None``: see above.
        backend_options: More arguments of the chosen class (e.g. ``{"remote_configs": ...}``
            for Ray, ``{"launcher": "mp"}`` for distributed, ``{"backend": "inline"}`` for
            process); the caller's dict is left unchanged. Not for ``"direct"``; a key also given
            as an argument, or a reserved one (``sync``, ``num_collectors``, ``num_workers``,
            ``backend_options``), raises ``ValueError``.
        num_collectors: How many collectors (worker processes or nodes) to run, a positive int:
            a single ``create_env_fn`` is used by each; a list of factories must have this
            length. Given without ``backend``, it selects ``"process"``.
        sync: With a non-direct backend, deliver every collector's batch together (``True``)
            or whichever collector's batch is ready first (``False``, the default).
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
        policy_factory: A zero-argument callable that builds the policy in the collector's
            thread (instead of ``policy``), as worker processes build theirs.
        use_buffers: TorchRL envs: preallocate each batch and stack steps into it (default:
            unless the env has dynamic specs); ``False`` stacks steps as they come, so batches
            may be lazily stacked. Other envs always write into preallocated storage.
        compact_obs: Leave the next observations (``("next", <observation>)``) out of
            batches: each is the root observation of the following step.
        trust_policy: Use the policy's outputs as they come: no wrapping of a plain module
            for TorchRL envs, no check against the action spec otherwise. Default: only for
            TorchRL's ``RandomPolicy`` and ``CudaGraphModule``.
        compile_policy: ``True`` or ``torch.compile`` keyword arguments: compile the policy
            (TorchRL envs; with a warm-up, as TorchRL does).
        cudagraph_policy: ``True`` or keyword arguments: wrap the policy in tensordict's
            ``CudaGraphModule`` (TorchRL envs; on a machine without CUDA it warns and runs
            the policy as it is, as in TorchRL).
        track_policy_version: TorchRL envs: ``True`` appends TorchRL's ``PolicyVersion``
            transform (each frame then holds its ``"policy_version"``); a ``PolicyVersion``
            instance is appended as given. Every frame also holds aiocollect's own
            ``("collector", "policy_version")`` whatever this says.
        return_same_td: Yield the same TensorDict every batch, overwritten in place (no copy;
            keep what you need before the next batch). Not with a replay buffer.
        no_cuda_sync: Accepted for TorchRL compatibility: aiocollect never calls
            ``torch.cuda.synchronize`` while collecting.
        auto_register_policy_transforms: TorchRL envs with a recurrent policy: ``True``
            appends the ``InitTracker`` and primer transforms the policy needs; ``None``
            (default) warns (``FutureWarning``) that they are missing; ``False`` neither.
        track_provenance: Record each frame's ``("collector", "worker_id")`` and
            ``("collector", "policy_version")`` (the worker and the weights that collected it).
            ``None`` (default): on, except for TorchRL envs, whose batches keep exactly
            TorchRL's keys unless ``True``.
        pre_collect_hook: Called with no argument before each batch (see `pre_collect_hook`).
        post_collect_hook: Called with each batch as it is yielded, or written to the replay
            buffer (see `post_collect_hook`).
        worker_idx: This collector's index among others (TorchRL's; read back as `worker_idx`).
        weight_sync_schemes: TorchRL's ``{"policy": scheme}``: shared-memory or multiprocess schemes
            load the weights; ``NoWeightSyncScheme`` ignores updates (see `update_policy_weights_`).
        weight_updater: TorchRL's deprecated ``WeightUpdaterBase``, which then pushes the weights.
        weight_recv_schemes: ``None`` only (``NotImplementedError`` otherwise): TorchRL's
            receivers of weights from a parent process; aiocollect's collectors take weights
            from `update_policy_weights_`.

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
        policy_factory: Any = None,
        use_buffers: bool | None = None,
        compact_obs: bool = False,
        trust_policy: bool | None = None,
        compile_policy: bool | dict[str, Any] | None = None,
        cudagraph_policy: bool | dict[str, Any] | None = None,
        track_policy_version: Any = False,
        return_same_td: bool = False,
        no_cuda_sync: bool = False,
        auto_register_policy_transforms: bool | None = None,
        track_provenance: bool | None = None,
        pre_collect_hook: Callable[[], Any] | None = None,
        post_collect_hook: Callable[[TensorDictBase], Any] | None = None,
        worker_idx: int | None = None,
        weight_sync_schemes: dict[str, Any] | None = None,
        weight_updater: Any = None,
        weight_recv_schemes: dict[str, Any] | None = None,
    ) -> None:
        if policy_factory is not None:
            if policy is not None:
                raise TypeError("policy_factory cannot be used with policy; give one of them")
            if not callable(policy_factory):
                raise TypeError(f"policy_factory must be a zero-argument callable, got {policy_factory!r}")
        self._cfg = validate_config(
            create_env_fn=create_env_fn, policy=policy, frames_per_batch=frames_per_batch,
            total_frames=total_frames, max_frames_per_traj=max_frames_per_traj,
            init_random_frames=init_random_frames, reset_at_each_iter=reset_at_each_iter,
            postproc=postproc, split_trajs=split_trajs, exploration_type=exploration_type,
            reset_when_done=reset_when_done, device=device, env_device=env_device,
            policy_device=policy_device, storing_device=storing_device,
            create_env_kwargs=create_env_kwargs, set_truncated=set_truncated,
            track_traj_ids=track_traj_ids, max_queued_batches=max_queued_batches,
            shutdown_timeout=shutdown_timeout, use_buffers=use_buffers, compact_obs=compact_obs,
            trust_policy=trust_policy, compile_policy=compile_policy, cudagraph_policy=cudagraph_policy,
            track_policy_version=track_policy_version, return_same_td=return_same_td, no_cuda_sync=no_cuda_sync,
            auto_register_policy_transforms=auto_register_policy_transforms, track_provenance=track_provenance,
        )  # fmt: skip
        cfg = self._cfg
        if return_same_td and replay_buffer is not None:
            raise ValueError("return_same_td=True yields the collector's own buffers, a replay buffer takes copies; "
                             "drop one of them")  # fmt: skip
        self._policy_factory = policy_factory
        if worker_idx is not None and (isinstance(worker_idx, bool) or not isinstance(worker_idx, int)):
            raise TypeError(f"worker_idx must be an int or None, got {worker_idx!r}")
        self._worker_idx = worker_idx
        self.pre_collect_hook, self.post_collect_hook = pre_collect_hook, post_collect_hook
        self._same_out: Any = None  # return_same_td: the batch storage handed out every time
        self._policy = PolicyAdapter(policy, policy_device=cfg.policy_device, exploration_type=cfg.exploration_type)
        self._init_weight_sync("Collector", weight_sync_schemes, weight_updater, workers=False)
        check_recv_schemes("Collector", weight_recv_schemes)
        adapter, sync = self._policy, self._weight_sync
        if adapter.policy is not adapter.original and policy_factory is None:
            # It collects with a copy on policy_device: training the original in place does not reach it.
            holder = f"its copy on policy_device={cfg.policy_device}"
            require_materialized(adapter.original, holder)
            if sync.enabled and sync.updater is None:
                self._inplace_watch = InPlaceWatch("Collector", adapter.original, None, holder=holder)
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
            split_trajs=bool(cfg.split_trajs), reset_at_each_iter=bool(cfg.reset_at_each_iter),
        )  # fmt: skip

    # -- lifecycle -----------------------------------------------------------------------------
    def _build(self) -> None:
        cfg = self._cfg
        if self._policy_factory is not None:
            # Built where it runs, as a worker process builds its own (the factory may hold what
            # cannot be pickled or shared).
            adapter = PolicyAdapter(
                self._policy_factory(), policy_device=cfg.policy_device, exploration_type=cfg.exploration_type
            )
            adapter.version, self._policy = self._policy.version, adapter  # load_state_dict may have set it
        self._policy.trusted = bool(cfg.trust_policy)
        env = make_env(cfg)
        if isinstance(env, AsyncBatchedEnv):
            env.cancel_grace = cfg.shutdown_timeout
        try:
            if getattr(env, "min_ready", None) is not None:
                self._policy.bind(env.spec, counts_steps=cfg.max_frames_per_traj is not None)
                self._rollout = barrier_free_rollout(env, self._policy, cfg, self._counter, self._generator,
                                                     self._lane.stop)  # fmt: skip
            else:
                rollout = make_rollout(
                    env, self._policy, cfg, traj_counter=self._counter, generator=self._generator,
                    stop=self._lane.stop, storing_device=cfg.storing_device,
                )  # fmt: skip
                if isinstance(env, TorchRLEnv):
                    # TorchRL's collectors reset the env and dry-run the policy when they start: a
                    # policy that does not fit the env fails there, not at the first batch.
                    rollout.prepare()
                self._rollout = rollout
        except BaseException:
            env.close()
            raise
        self._env = env
        self._set_policy_version(self._policy.version)  # a PolicyVersion transform starts from it
        self._hidden = getattr(self._rollout, "hidden_keys", ())
        self._apply_seeds()

    async def _start(self) -> None:
        await self._lane.run(self._build)

    def _iterates_in_task_group(self) -> bool:
        """Whether iteration needs ``async with`` (env steps that are tasks outliving a batch)."""
        rollout = self._rollout
        return isinstance(rollout, StreamRollout) and rollout.needs_tasks()

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
        close_error: Exception | None = None  # the env's own, raised once the lane is closed too
        with anyio.move_on_after(timeout):
            # Queued behind the call in progress (a step sees the stop flag at its next step).
            try:
                if isinstance(env, AsyncBatchedEnv):
                    await self._lane.run_final(lambda: None)  # the step in progress, if any, ends first
                    await env.aclose()  # its connections belong to this event loop
                elif env is not None:
                    await self._lane.run_final(env.close)
            except Exception as exc:
                close_error = exc
            await self._lane.aclose()
            if close_error is not None:
                raise close_error
            return
        self._lane.close()  # its daemon thread is stuck in user code: it cannot keep the process alive
        warn_user(
            f"the env did not finish its {'step and close' if env is not None else 'construction'} within "
            f"shutdown_timeout={timeout}s; it was left running in a daemon thread",
            RuntimeWarning,
        )
        if close_error is not None:
            raise close_error

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
        if self._pre_collect_hook is not None:
            await self._lane.run(self._pre_collect_hook)
        start = time.perf_counter()
        post, hooked = self._needs_post(), self._post_hooks_set()  # a hook needs the batch as one TensorDict
        rb = self._batch_rb
        if rb is not None and rb.direct_writes and rollout.buf is not None and not (post or hooked):
            await self._collect_into_buffer(rollout, random, start)
            return None
        if isinstance(rollout, StreamRollout) and rollout.needs_tasks():
            if self._tg is None:
                # Its env steps outlive a batch, so they need an owner that outlives one too.
                raise RuntimeError(
                    f"this {type(self).__name__}'s env steps are tasks of its task group (a barrier-free "
                    "AsyncEnvPool, coroutine envs or a coroutine policy); iterate it inside "
                    "'async with collector:'"
                )
            rollout.spawn = self._tg.start_soon
        if isinstance(rollout.env, AsyncBatchedEnv):
            batch = await rollout.acollect(random, self._lane.run)
        elif self._cfg.return_same_td and not post:
            batch = await self._lane.run(self._collect_same, rollout, random)
        else:
            batch = await self._lane.run(rollout.collect, random)
        frames = batch.numel()
        if hooked and (self._batch_rb is not None or self._torchrl_rb is not None):  # hooked before it is written
            batch, post = await self._lane.run(self._post_and_hooks, batch, post), False
        # The first batch (which fixes the storage layout) and post-processed batches are
        # copied into a replay buffer; later batches are written straight into its rows.
        out = await self._deliver(batch, frames, start, post=post, run=self._lane.run)
        if hooked and out is not None:  # the very object iteration yields
            await self._lane.run(self._run_post_hooks, out)
        return out

    # -- control -------------------------------------------------------------------------------
    async def _send_update(self, update: WeightUpdate) -> None:
        # In process: load into the collection policy (never during a policy call), or let a
        # weight_updater push; {0: weights} is this collector's own per-worker form.
        source = update.source if update.per_worker is None else update.per_worker[0]
        self._inplace_watch = None
        load = partial(self._policy.update_weights, updater=self._weight_sync.updater, worker_ids=update.worker_ids)
        await to_thread(load, source)
        applied = getattr(self._rollout, "weights_applied", None)
        if applied is not None:
            applied()
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
        if self._rollout is not None:
            restore_version(self._rollout, version)

    def _extra_state(self) -> dict[str, Any]:
        return {"traj_pool": self._counter.next, "generator_state": self._generator.get_state()}

    def _load_extra_state(self, state_dict: dict[str, Any]) -> None:
        self._counter.next = max(self._counter.next, int(state_dict["traj_pool"]))
        self._generator.set_state(state_dict["generator_state"])
        self.reset()  # envs restart from a reset, with fresh trajectory ids

"""TorchRL's collector API around collection: hooks, profiling, remote helpers, attributes.

TorchRL's users (and its tests) call these on every collector: ``pre_collect_hook`` /
``post_collect_hook``, ``enable_profile``, ``map_fn`` / ``get_distant_attr`` /
``cascade_execute``, ``getattr_env`` and friends, ``replay_buffer``, ``total_frames``,
``requested_frames_per_batch``, ``next()``, ``iterator()``. `CollectorAPI`
implements them for a collector that collects in this process; the multi-worker collectors
override what reaches into their workers (``_multi._calls``). The remote helpers are
coroutines, as every call that may wait on a worker is; the blocking twins make each one
call.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from .._core._profile import ProfileConfig, ProfilerHook
from .._core._remote import call_lists, call_path, resolve_path

__all__ = ["CollectorAPI", "InProcessAttributes"]

PROFILE_AFTER_ITERATION = (
    "Cannot enable profiling after iteration has started; call enable_profile() before iterating over the collector"
)


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class CollectorAPI:
    """Mixed into `CollectorLifecycle` (not public); see the module docstring."""

    _pre_collect_hook: Any = None
    _post_collect_hook: Any = None
    _profile: ProfileConfig | None = None
    _profiler: ProfilerHook | None = None  # the in-process collector's own (workers hold theirs)
    _iteration_started = False
    _user_rb: Any = None  # the replay buffer as given (a TorchRL buffer, or aiocollect's)
    _total_frames: float
    _frames_per_batch: int
    # As given to the constructor (set by _init_lifecycle; collectors without the mode keep None).
    _traj_options: tuple[int | None, str | None, int | None] = (None, None, None)

    # -- hooks -----------------------------------------------------------------------------------
    @property
    def pre_collect_hook(self) -> Any:
        """Called with no argument before each batch is collected, or ``None`` (the default).

        It runs where the envs are stepped: the collection thread of an in-process collector,
        each worker process of a multi-worker one (setting it there sends it to the running
        workers, cloudpickled). What it raises stops collection and is raised to the consumer
        (as a `WorkerError` from a worker).
        """
        return self._pre_collect_hook

    @pre_collect_hook.setter
    def pre_collect_hook(self, hook: Any) -> None:
        self._set_hook("pre_collect_hook", hook)

    @property
    def post_collect_hook(self) -> Any:
        """Called with each batch, or ``None`` (the default); its return value is ignored.

        In-process, it gets the very object iteration yields (after ``postproc``), or the batch
        written to the replay buffer, before it is written. In a multi-worker collector it runs
        in each worker with that worker's batch, before the worker hands it over. It runs
        where `pre_collect_hook` runs, and what it raises stops collection the same way. While
        `enable_profile` profiles an in-process collector this reads the profiler hook, which
        runs after yours (setting this replaces yours, not the profiler).
        """
        return self._profiler if self._profiler is not None else self._post_collect_hook

    @post_collect_hook.setter
    def post_collect_hook(self, hook: Any) -> None:
        self._set_hook("post_collect_hook", hook)

    def set_post_collect_hook(self, hook: Any) -> None:
        """Set `post_collect_hook` (TorchRL's method form of the setter).

        Args:
            hook: A callable taking the batch, or ``None`` to remove it.
        """
        self._set_hook("post_collect_hook", hook)

    def _set_hook(self, name: str, hook: Any) -> None:
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be a callable or None, got {hook!r}")
        payload = self._prepare_hook(name, hook)
        setattr(self, f"_{name}", hook)
        self._hook_changed(name, payload)

    def _prepare_hook(self, name: str, hook: Any) -> Any:
        """Check ``hook`` can go where it runs (workers: picklable); what `_hook_changed` sends."""
        return None

    def _hook_changed(self, name: str, payload: Any) -> None:
        """A hook was set: in-process, the next batch reads it; workers are told (``_multi._calls``)."""

    def _post_hooks_set(self) -> bool:
        return self._post_collect_hook is not None or self._profiler is not None

    def _run_post_hooks(self, batch: Any) -> None:
        """The user's post-collect hook, then the profiler's (in the collection thread)."""
        if self._post_collect_hook is not None:
            self._post_collect_hook(batch)
        if self._profiler is not None:
            self._profiler(batch)

    def _post_and_hooks(self, batch: Any, post: bool) -> Any:
        """The batch as the replay buffer gets it (own columns out, post-processed), once the hooks saw it."""
        batch = self._without_hidden(batch)  # type: ignore[attr-defined]
        if post:
            batch = self._post(batch)  # type: ignore[attr-defined]
        self._run_post_hooks(batch)
        return batch

    # -- profiling ------------------------------------------------------------------------------
    def enable_profile(
        self,
        *,
        workers: list[int] | None = None,
        num_rollouts: int = 3,
        warmup_rollouts: int = 1,
        save_path: Any = None,
        activities: list[str] | None = None,
        record_shapes: bool = True,
        profile_memory: bool = False,
        with_stack: bool = True,
        with_flops: bool = False,
        on_trace_ready: Any = None,
    ) -> None:
        """Profile rollouts with ``torch.profiler`` and write a Chrome trace (TorchRL's ``enable_profile``).

        The profiler runs as one more post-collect hook where rollouts run: this process's
        collection thread, or each chosen worker process. It records rollouts
        ``max(warmup_rollouts, 1) + 1`` to ``num_rollouts`` and then writes the trace;
        shutting down first writes what it recorded. Your own `post_collect_hook` keeps
        running. Call it before iterating.

        Args:
            workers: Worker indices to profile (default ``[0]``); an in-process collector
                profiles its own rollouts and ignores it.
            num_rollouts: Rollouts after which profiling stops.
            warmup_rollouts: Rollouts left out first (JIT and caches warm up).
            save_path: Trace file; ``{worker_idx}`` is replaced by the worker's index
                (default ``./collector_profile_{worker_idx}.json``).
            activities: ``"cpu"`` and/or ``"cuda"`` (default both; CUDA only where available).
            record_shapes: Record tensor shapes.
            profile_memory: Record memory allocations.
            with_stack: Record Python stacks.
            with_flops: Estimate FLOPs.
            on_trace_ready: Called with the ``torch.profiler.profile`` instead of writing
                the trace to ``save_path``.

        Raises:
            RuntimeError: Iteration (or ``start()``) has already begun.
            ValueError: ``num_rollouts`` is not above ``warmup_rollouts``, or (multi-worker
                collectors) a worker index is out of range.
        """
        if self._iteration_started:
            raise RuntimeError(PROFILE_AFTER_ITERATION)
        config = ProfileConfig(
            workers=[0] if workers is None else list(workers), num_rollouts=num_rollouts,
            warmup_rollouts=warmup_rollouts, save_path=save_path,
            activities=["cpu", "cuda"] if activities is None else list(activities), record_shapes=record_shapes,
            profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops, on_trace_ready=on_trace_ready,
        )  # fmt: skip
        self._check_profiled_workers(config)
        self.disable_profile()
        self._profile = config
        self._install_profiler(config)

    def disable_profile(self) -> None:
        """Stop profiling (writing what was recorded) and restore the hooks as they were; a no-op if not profiling."""
        if self._profile is None:
            return
        try:
            self._remove_profiler()
        finally:
            self._profile = None

    @property
    def profile_config(self) -> ProfileConfig | None:
        """The `ProfileConfig` of `enable_profile`, or ``None`` when not profiling."""
        return self._profile

    def _check_profiled_workers(self, config: ProfileConfig) -> None:
        """In-process: ``workers`` does not apply."""

    def _install_profiler(self, config: ProfileConfig) -> None:
        self._profiler = ProfilerHook(config, worker_idx=getattr(self, "_worker_idx", None) or 0)

    def _remove_profiler(self) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            profiler.stop()

    # -- remote helpers ---------------------------------------------------------------------------
    async def get_distant_attr(self, attr: str) -> Any:
        """The object at attribute path ``attr`` (``"env.batch_size"``, ``"env.transform[0]"``).

        Multi-worker collectors return one value per worker, in worker order, read in the
        workers (TorchRL's remote helper).

        Args:
            attr: Attribute names joined by dots, each with optional ``[index]`` subscripts.

        Raises:
            AttributeError: The path does not exist.
        """
        return resolve_path(self, attr)

    async def cascade_execute(self, attr_path: str, *args: Any, **kwargs: Any) -> Any:
        """Call the callable at ``attr_path`` with ``args``/``kwargs`` (awaited if a coroutine), in this process.

        A path to something that is not callable returns it (and takes no arguments).

        Raises:
            ValueError: Arguments were given for something that is not callable.
        """
        target = resolve_path(self, attr_path)
        if callable(target):
            return await _awaited(target(*args, **kwargs))
        if args or kwargs:
            raise ValueError(f"{attr_path!r} is not callable; it takes no arguments, got {args!r} and {kwargs!r}")
        return target

    async def map_fn(
        self, method_name: str, list_of_args: list[Any] | None = None, list_of_kwargs: list[Any] | None = None
    ) -> list[Any]:
        """Call the method at attribute path ``method_name`` once per argument entry; return the results.

        In-process, one call per entry (one call without arguments if neither list is
        given). Multi-worker collectors call it in each worker, with one entry per worker,
        and return the workers' results in worker order (paths under ``replay_buffer`` are
        answered by this process's buffer, which the workers share). Coroutines are awaited.

        Args:
            method_name: Attribute path of the method (``"get_distant_attr"``,
                ``"replay_buffer.__len__"``).
            list_of_args: Positional arguments of each call, a tuple per call.
            list_of_kwargs: Keyword arguments of each call, a dict per call.

        Raises:
            ValueError: The lists' lengths differ (or differ from the number of workers).
            AttributeError: ``method_name`` does not exist or is not callable.
        """
        calls = call_lists(list_of_args, list_of_kwargs)
        return [await _awaited(call_path(self, method_name, args, kwargs)) for args, kwargs in calls]

    async def getattr_env(self, attr: str) -> Any:
        """``getattr(env, attr)`` (multi-worker collectors: worker 0's env, as TorchRL)."""
        return getattr(self._env_for_attr(), attr)

    async def getattr_policy(self, attr: str) -> Any:
        """``getattr(policy, attr)`` (multi-worker collectors: worker 0's policy, as TorchRL)."""
        return getattr(self.policy, attr)

    async def getattr_rb(self, attr: str) -> Any:
        """``getattr(replay_buffer, attr)``."""
        return getattr(self.replay_buffer, attr)

    def _env_for_attr(self) -> Any:
        raise AttributeError(f"{type(self).__name__} has no env in this process")

    # -- attributes ------------------------------------------------------------------------------
    @property
    def policy(self) -> Any:
        """The collection policy (``None``: random actions, or a policy still to be built)."""
        return getattr(self, "_policy", None)

    @property
    def replay_buffer(self) -> Any:
        """The replay buffer given to the constructor (``None`` if none)."""
        return self._user_rb

    @property
    def total_frames(self) -> int | float:
        """The frame budget: an int, or ``float("inf")`` for an endless collector (TorchRL's value)."""
        total = self._total_frames
        return total if math.isinf(total) else int(total)

    @property
    def requested_frames_per_batch(self) -> int:
        """Frames in each batch, across the env batch (and every worker of a synchronous collector)."""
        return int(self._frames_per_batch)

    @property
    def trajs_per_batch(self) -> int | None:
        """Complete trajectories per batch (complete-trajectory mode), or ``None``: batches of frames."""
        return self._traj_options[0]

    @property
    def traj_format(self) -> str:
        """How a complete-trajectory batch is laid out: ``"padded"`` (the default) or ``"cat"``."""
        return self._traj_options[1] or "padded"

    @property
    def trajs_per_write(self) -> int | None:
        """Trajectories per replay-buffer ``extend`` in complete-trajectory mode (``None``: all at once)."""
        return self._traj_options[2]

    def get_model(self, model_id: str) -> Any:
        """The model that weight updates with ``model_id`` refer to (TorchRL's lookup, in this process).

        Args:
            model_id: ``"policy"`` (the collection policy), or an attribute path of this
                collector (``"env.transform[0].module"``), resolved as `get_distant_attr` does.

        Raises:
            ValueError: ``model_id="policy"`` and the collector holds no policy here (random
                actions, or workers building theirs with ``policy_factory``).
            AttributeError: The path does not exist.
        """
        if model_id != "policy":
            return resolve_path(self, model_id)
        policy = self.policy
        if policy is None:
            raise ValueError(
                f"No policy found for model_id 'policy': {type(self).__name__} holds no policy in this process "
                "(random actions, or a policy_factory its workers call); pass policy= to have one"
            )
        return policy

    # -- iteration, TorchRL's way ----------------------------------------------------------------
    async def next(self) -> Any:
        """The next batch, or ``None`` once the frame budget is spent (TorchRL's ``next()``)."""
        try:
            return await self.__anext__()  # type: ignore[attr-defined]
        except StopAsyncIteration:
            return None

    def iterator(self) -> Any:
        """This collector as an (async) iterator over its batches (TorchRL's ``iterator()``)."""
        return self


class InProcessAttributes:
    """TorchRL's attributes of the in-process collector (mixed into `Collector`)."""

    _env: Any
    _rollout: Any
    _policy: Any  # a PolicyAdapter
    _worker_idx: int | None
    _frames_per_batch: int

    @property
    def env(self) -> Any:
        """The env being stepped (``None`` until the collector has started).

        A TorchRL env is the TorchRL env object itself, with the transforms the collector
        appended (``StepCounter``, ``PolicyVersion``); other envs are aiocollect's wrapper.
        """
        from .._envs._torchrl import TorchRLEnv

        env = self._env
        return env.env if isinstance(env, TorchRLEnv) else env

    def _env_for_attr(self) -> Any:
        if self._env is None:
            raise AttributeError("the env is built when the collector starts; start it first ('async with' it)")
        return self.env

    @property
    def policy(self) -> Any:
        """The collection policy (``None``: random actions, or a ``policy_factory`` not called yet)."""
        return self._policy.policy

    @property
    def worker_idx(self) -> int | None:
        """The ``worker_idx`` given to the constructor (``None`` by default)."""
        return self._worker_idx

    @property
    def frames_per_batch(self) -> int:
        """Steps per env in each batch (TorchRL's meaning: ``requested_frames_per_batch`` over the env batch).

        Before the env is built, the ``frames_per_batch`` given.
        """
        steps = getattr(self._rollout, "T", None)
        return int(steps) if steps is not None else int(self._frames_per_batch)

    @property
    def requested_frames_per_batch(self) -> int:
        """Frames in each batch, across the env batch: ``frames_per_batch`` rounded up to a multiple of it."""
        rollout = self._rollout
        if rollout is None or getattr(rollout, "T", None) is None:
            return int(self._frames_per_batch)
        return int(rollout.T) * math.prod(getattr(rollout, "B", ()))

"""DataCollectorBase: the blocking face shared by every blocking collector twin."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from functools import partial
from types import TracebackType
from typing import Any, ClassVar

from tensordict import TensorDictBase

from .._core._portal import Portal
from .._core._public import publish
from .._core._stats import CollectorStats
from ._twins import twin_doc, twin_init

__all__ = ["DataCollectorBase"]

_END = object()


async def _anext_or_end(iterator: Any) -> Any:
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        return _END


class DataCollectorBase:
    """Base class of every blocking collector: a thin portal over one async collector.

    Subclasses only name their async twin in ``_async_class``. Every method is one call
    through an anyio blocking portal (an event loop in a helper thread), so the blocking and
    async APIs share one implementation. Using a blocking collector from inside a running
    event loop raises ``RuntimeError`` naming the async class to use instead. As TorchRL's
    collectors, the constructor builds the envs and the policy (and starts worker
    processes): an env or policy that cannot work fails there.

    Examples:
        >>> from aiocollect import SyncDataCollector
        >>> with SyncDataCollector("CartPole-v1", frames_per_batch=32, total_frames=64) as c:
        ...     print([batch.shape for batch in c])
        [torch.Size([32]), torch.Size([32])]
    """

    _async_class: ClassVar[type[Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_async_class" in cls.__dict__:
            cls.__init__ = twin_init(cls, cls._async_class, DataCollectorBase.__init__)  # type: ignore[method-assign]
            cls.__doc__ = twin_doc(cls, cls._async_class)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._async = self._async_class(*args, **kwargs)
        cls = type(self)
        self._portal = Portal(f"{cls.__module__}.{cls.__qualname__}", f"aiocollect.{self._async_class.__qualname__}")
        self._context: Any = None
        self._opened_by_start = False
        self._opened_by_iteration = False  # plain iteration opened the collector (see __next__)
        # As TorchRL's constructors do, build the envs and policy (and start the workers) now:
        # a script sees a bad env or policy at construction, and `env`/`policy` are there to read.
        try:
            self._portal.call(self._async._ensure_started)
        except BaseException:
            self._portal.stop()
            raise

    def __enter__(self) -> DataCollectorBase:
        self._context = self._portal.wrap_async_context_manager(self._async)
        try:
            self._context.__enter__()
        except BaseException:
            self._context = None  # __exit__ will not run: release everything now
            self.shutdown()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._context is not None:
                self._context.__exit__(exc_type, exc, tb)
        finally:
            self._context = None
            self.shutdown()

    def __iter__(self) -> DataCollectorBase:
        return self

    def __next__(self) -> TensorDictBase:
        if self._context is None and getattr(self._async, "_iterates_in_task_group", lambda: False)():
            # Its env steps are tasks that outlive a batch (a barrier-free pool): they need the
            # collector open, which plain iteration opens here and closes when it ends.
            self.__enter__()
            self._opened_by_iteration = True
        try:
            batch = self._portal.call(_anext_or_end, self._async)
        except BaseException as exc:
            if self._opened_by_iteration:
                self._opened_by_iteration = False
                self.__exit__(type(exc), exc, exc.__traceback__)
            elif self._context is None:  # plain iteration: nothing else will clean up
                self.shutdown()
            raise
        if batch is _END:
            if self._opened_by_iteration:
                self._opened_by_iteration = False
                self.__exit__(None, None, None)
            else:
                self.shutdown()
            raise StopIteration
        return batch

    def next(self) -> TensorDictBase | None:
        """Return the next batch, or ``None`` when the frame budget is spent (TorchRL's ``next``)."""
        return next(self, None)

    def shutdown(self) -> None:
        """Stop collecting, close the envs and stop the portal thread. Idempotent."""
        if not self._portal.running:
            return
        try:
            # Teardown is bounded by shutdown_timeout, so a Ctrl-C meanwhile waits for it.
            self._portal.call(self._async.aclose, interruptible=False)
        finally:
            if self._context is None:  # inside 'with', __exit__ stops the portal
                self._portal.stop()

    def start(self) -> None:
        """Collect into the replay buffer in a background task until the budget is spent.

        Opens the collector if it is not open yet; stop it with `async_shutdown` (or by
        leaving ``with``). Sample with ``replay_buffer.sample()`` meanwhile.
        """
        if self._context is None:
            self.__enter__()
            self._opened_by_start = True
        self._portal.call(self._async.start)

    def pause(self) -> AbstractContextManager[None]:
        """A context manager inside which the background collection writes nothing."""
        return self._portal.wrap_async_context_manager(self._async.pause())

    def is_running(self) -> bool:
        """Whether background collection (`start`) is still going."""
        return bool(self._async.is_running())

    def wait_finished(self) -> None:
        """Block until background collection (`start`) has ended; see the async twin's method."""
        self._portal.call(self._async.wait_finished)

    def async_shutdown(self, timeout: float | None = None) -> None:
        """Stop background collection and shut down (TorchRL's name for it).

        Raises the background collection's error if no ``sample()`` raised it yet.

        Args:
            timeout: Ignored; the collector's ``shutdown_timeout`` bounds the shutdown.
        """
        try:
            if self._portal.running:
                self._portal.call(self._async.async_shutdown, interruptible=False)
        finally:
            if self._opened_by_start or self._opened_by_iteration:
                self._opened_by_start = self._opened_by_iteration = False
                self.__exit__(None, None, None)

    def update_policy_weights_(
        self,
        policy_or_weights: Any = None,
        *,
        weights: Any = None,
        policy: Any = None,
        worker_ids: Any = None,
        model_id: str | None = None,
        weights_dict: dict[str, Any] | None = None,
    ) -> None:
        """Bring the collection policy up to date; see the async twin's method for every form and error."""
        given = {"weights": weights, "policy": policy, "worker_ids": worker_ids, "model_id": model_id}
        # Only the keywords given: a node collector's method takes fewer of them.
        kwargs = {k: v for k, v in {**given, "weights_dict": weights_dict}.items() if v is not None}
        self._portal.call(partial(self._async.update_policy_weights_, policy_or_weights, **kwargs))

    @property
    def policy_version(self) -> int:
        """The collector's policy version (``+1`` per weight update); see the async twin's property."""
        return self._async.policy_version

    def get_policy_version(self) -> int:
        """Return `policy_version` (TorchRL's method form)."""
        return self._async.get_policy_version()

    @property
    def _weight_sync_schemes(self) -> dict[str, Any] | None:
        return self._async._weight_sync_schemes  # TorchRL's attribute, read by code written for it

    def set_seed(self, seed: int) -> int:
        """Seed envs and random actions; see the async twin's method."""
        return self._portal.call(self._async.set_seed, seed)

    def reset(self) -> None:
        """Reset every env at the start of the next batch."""
        self._portal.call(self._async.reset)

    def state_dict(self) -> dict[str, Any]:
        """Return the collector's resumable state."""
        return self._portal.call(self._async.state_dict)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state dict produced by `state_dict`."""
        self._portal.call(self._async.load_state_dict, state_dict)

    def fake_tensordict(self) -> TensorDictBase:
        """A zero-filled batch shaped and keyed like this collector's; see the async twin's method.

        Raises:
            NotImplementedError: Worker-process collectors (their envs live in the workers), as in TorchRL.
        """
        fake = getattr(self._async, "fake_tensordict", None)
        if fake is None:
            raise NotImplementedError(
                f"{type(self).__name__}.fake_tensordict() is not available: its envs live in worker processes; "
                "collect one batch instead"
            )
        return self._portal.call(fake)

    def stats(self, **options: Any) -> CollectorStats:
        """Return a `CollectorStats` snapshot; see the async twin's method.

        Args:
            **options: The async twin's options: ``workers="aggregate"|"per_worker"|"both"``
                for multi-worker collectors.
        """
        return self._portal.call(partial(self._async.stats, **options))

    # -- TorchRL's collector API: hooks, profiling, remote helpers, attributes ------------------
    @property
    def pre_collect_hook(self) -> Any:
        """Called with no argument before each batch, or ``None``; see the async twin's property."""
        return self._async.pre_collect_hook

    @pre_collect_hook.setter
    def pre_collect_hook(self, hook: Any) -> None:
        self._portal.call(setattr, self._async, "pre_collect_hook", hook)

    @property
    def post_collect_hook(self) -> Any:
        """Called with each batch, or ``None``; see the async twin's property."""
        return self._async.post_collect_hook

    @post_collect_hook.setter
    def post_collect_hook(self, hook: Any) -> None:
        self._portal.call(setattr, self._async, "post_collect_hook", hook)

    def set_post_collect_hook(self, hook: Any) -> None:
        """Set `post_collect_hook` (TorchRL's method form of the setter)."""
        self._portal.call(self._async.set_post_collect_hook, hook)

    def enable_profile(self, **options: Any) -> None:
        """Profile rollouts with ``torch.profiler``; takes the async twin's keyword arguments.

        Args:
            **options: ``workers``, ``num_rollouts``, ``warmup_rollouts``, ``save_path``,
                ``activities``, ``record_shapes``, ``profile_memory``, ``with_stack``,
                ``with_flops``, ``on_trace_ready``: see the async twin's method.
        """
        self._portal.call(partial(self._async.enable_profile, **options))

    def disable_profile(self) -> None:
        """Stop profiling (writing what was recorded); see the async twin's method."""
        self._portal.call(self._async.disable_profile)

    @property
    def profile_config(self) -> Any:
        """The `ProfileConfig` of `enable_profile`, or ``None``."""
        return self._async.profile_config

    def map_fn(self, method_name: str, list_of_args: Any = None, list_of_kwargs: Any = None) -> list[Any]:
        """Call a method once per argument entry (per worker for multi-worker collectors); see the async twin."""
        return self._portal.call(self._async.map_fn, method_name, list_of_args, list_of_kwargs)

    def get_distant_attr(self, attr: str) -> Any:
        """The object at an attribute path (one per worker for multi-worker collectors); see the async twin."""
        return self._portal.call(self._async.get_distant_attr, attr)

    def cascade_execute(self, attr_path: str, *args: Any, **kwargs: Any) -> Any:
        """Call the callable at an attribute path of this collector; see the async twin's method."""
        return self._portal.call(partial(self._async.cascade_execute, attr_path, *args, **kwargs))

    def getattr_env(self, attr: str) -> Any:
        """``getattr(env, attr)`` (worker 0's env for multi-worker collectors)."""
        return self._portal.call(self._async.getattr_env, attr)

    def getattr_policy(self, attr: str) -> Any:
        """``getattr(policy, attr)`` (worker 0's policy for multi-worker collectors)."""
        return self._portal.call(self._async.getattr_policy, attr)

    def getattr_rb(self, attr: str) -> Any:
        """``getattr(replay_buffer, attr)``."""
        return self._portal.call(self._async.getattr_rb, attr)

    def rollout(self) -> TensorDictBase | None:
        """Collect one batch now, outside the frame budget; see the async twin's method."""
        return self._portal.call(self._async.rollout)

    def iterator(self) -> Iterator[TensorDictBase]:
        """This collector as an iterator over its batches (TorchRL's ``iterator()``)."""
        return self

    @property
    def env(self) -> Any:
        """The in-process collector's env (a TorchRL env itself, with the collector's transforms)."""
        return self._async.env

    @property
    def policy(self) -> Any:
        """The collection policy."""
        return self._async.policy

    @property
    def replay_buffer(self) -> Any:
        """The replay buffer given to the constructor, or ``None``."""
        return self._async.replay_buffer

    @property
    def worker_idx(self) -> int | None:
        """The in-process collector's ``worker_idx``."""
        return self._async.worker_idx

    @property
    def frames_per_batch(self) -> int:
        """The in-process collector's steps per env in each batch (TorchRL's meaning)."""
        return self._async.frames_per_batch

    @property
    def requested_frames_per_batch(self) -> int:
        """Frames in each batch, across the env batch (and workers)."""
        return self._async.requested_frames_per_batch

    @property
    def total_frames(self) -> int | float:
        """The frame budget (``float("inf")`` for an endless collector)."""
        return self._async.total_frames

    @property
    def trajs_per_batch(self) -> int | None:
        """Complete trajectories per batch, or ``None``: batches of frames."""
        return self._async.trajs_per_batch

    @property
    def traj_format(self) -> str:
        """How a complete-trajectory batch is laid out: ``"padded"`` (the default) or ``"cat"``."""
        return self._async.traj_format

    @property
    def trajs_per_write(self) -> int | None:
        """Trajectories per replay-buffer ``extend`` in complete-trajectory mode (``None``: all at once)."""
        return self._async.trajs_per_write

    def get_model(self, model_id: str) -> Any:
        """The model that weight updates with ``model_id`` refer to; see the async twin's method."""
        return self._async.get_model(model_id)

    def __len__(self) -> int:
        return len(self._async)

    def __repr__(self) -> str:
        return repr(self._async).replace(self._async_class.__name__, f"blocking.{type(self).__name__}", 1)

    def __del__(self) -> None:
        # Never wait here: at interpreter exit the portal's thread may already be frozen, and
        # a finalizer that waits on it hangs the process. Warn, free what needs no waiting.
        portal = getattr(self, "_portal", None)
        if portal is None or not portal.running:
            return
        warnings.warn(f"unclosed {self!r}; use 'with' or call shutdown()", ResourceWarning, stacklevel=1)
        if self._context is None:
            # Nothing runs in the portal's loop between calls: close synchronously here.
            self._async._finalize()
        # An open 'with' (or start()) has a task in the loop: cancelling it runs the
        # collector's bounded teardown in the portal's own thread.
        portal.stop_nowait()


# Its public path (what aiocollect's lazy __getattr__ would set) from the start: help() of every
# blocking twin names its base class, and `import aiocollect.blocking` alone never runs __getattr__.
publish(DataCollectorBase)

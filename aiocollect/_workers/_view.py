"""A worker as TorchRL's remote helpers see it: the hooks it runs and the attributes it shows.

TorchRL's worker processes each run a whole ``Collector``, and ``map_fn``/``get_distant_attr``
resolve attribute paths on it. An aiocollect worker runs the rollout engine instead; this
`WorkerView` stands in for that inner collector: ``worker_idx``, ``env``, ``policy``,
``frames_per_batch``, ``stats()``, the hooks, and the helpers themselves (so
``map_fn("get_distant_attr", ...)`` works as in TorchRL). It also runs the hooks around each
batch and answers `RemoteCall` commands. Only the worker loop's thread touches it.
"""

from __future__ import annotations

import math
import pickle
import traceback
from typing import Any

from ._messages import RemoteCall, Reply, SetHook, WorkerSpec

__all__ = ["WorkerView"]

_HOOKS = ("pre_collect_hook", "post_collect_hook", "profiler")


class WorkerView:
    """What one worker shows to ``map_fn``/``get_distant_attr``; see the module docstring."""

    def __init__(self, spec: WorkerSpec, rollout: Any, layout: Any) -> None:
        self.worker_idx = spec.worker_id
        self._rollout, self._layout = rollout, layout
        self.pre_collect_hook = spec.pre_collect_hook
        self.post_collect_hook = spec.post_collect_hook
        self.profiler = spec.profiler
        self.frames = 0
        self.batches = 0
        #: Workers collect until the collector stops them (TorchRL's inner collectors too).
        self.total_frames = math.inf
        self.replay_buffer = None  # the buffer lives in the collector's process (see map_fn there)

    # -- what TorchRL's inner collector shows --------------------------------------------------
    @property
    def env(self) -> Any:
        """The worker's env (a TorchRL env itself, with the transforms the collector added)."""
        from .._envs._own_loop import OwnLoopEnv
        from .._envs._torchrl import TorchRLEnv

        env = self._rollout.env
        if isinstance(env, OwnLoopEnv):  # an async env, stepped on the worker's own event loop
            env = env.env
        return env.env if isinstance(env, TorchRLEnv) else env

    @property
    def policy(self) -> Any:
        """The worker's policy module."""
        return self._rollout.policy.policy

    @property
    def policy_version(self) -> int:
        """The version of the weights the worker collects with."""
        return int(self._rollout.policy.version)

    @property
    def frames_per_batch(self) -> int:
        """Steps per env in each batch (TorchRL's meaning: the requested frames over the env batch)."""
        return int(self._layout.shape[-1])

    @property
    def requested_frames_per_batch(self) -> int:
        """Frames in each of this worker's batches, across its env batch."""
        return math.prod(self._layout.shape)

    def stats(self) -> dict[str, Any]:
        """This worker's counters: frames, batches, requested_frames_per_batch, policy_version."""
        return {
            "frames": self.frames,
            "batches": self.batches,
            "requested_frames_per_batch": self.requested_frames_per_batch,
            "policy_version": self.policy_version,
        }

    def get_distant_attr(self, attr: str) -> Any:
        """The object at attribute path ``attr`` of this view."""
        from .._core._remote import resolve_path

        return resolve_path(self, attr)

    def cascade_execute(self, attr_path: str, *args: Any, **kwargs: Any) -> Any:
        """Call the callable at ``attr_path`` with the arguments, or return a non-callable's value."""
        from .._core._remote import resolve_path

        target = resolve_path(self, attr_path)
        if not callable(target):
            if args or kwargs:
                raise ValueError(f"{attr_path!r} is not callable; it takes no arguments, got {args!r} and {kwargs!r}")
            return target
        return target(*args, **kwargs)

    def map_fn(self, method_name: str, list_of_args: Any = None, list_of_kwargs: Any = None) -> list[Any]:
        """Call ``method_name`` once per entry of the argument lists (TorchRL's in-process rule)."""
        from .._core._remote import call_lists, call_path

        return [call_path(self, method_name, a, k) for a, k in call_lists(list_of_args, list_of_kwargs)]

    def getattr_env(self, attr: str) -> Any:
        """``getattr(env, attr)``."""
        return getattr(self.env, attr)

    def getattr_policy(self, attr: str) -> Any:
        """``getattr(policy, attr)``."""
        return getattr(self.policy, attr)

    # -- the worker loop's side ----------------------------------------------------------------
    def before_batch(self) -> None:
        """Run the pre-collect hook (its exception fails the worker)."""
        if self.pre_collect_hook is not None:
            self.pre_collect_hook()

    def after_batch(self, out: Any) -> None:
        """Count a finished batch and run the post-collect hooks on it (``out``: its tensors or TensorDict)."""
        self.batches += 1
        post, profiler = self.post_collect_hook, self.profiler
        if post is None and profiler is None:
            self.frames += math.prod(self._layout.shape)
            return
        batch = self._as_batch(out)
        self.frames += batch.numel()
        if post is not None:
            post(batch)
        if profiler is not None:
            profiler(batch)

    def _as_batch(self, out: Any) -> Any:
        """The batch as the collector delivers it: a TensorDict, without the collector's own columns."""
        from tensordict import TensorDict

        from .._rollout._layout import restore_nested

        if isinstance(out, dict):
            shape = self._layout.shape
            out = restore_nested(TensorDict(dict(out), batch_size=shape), self._layout)
        hidden = [k for k in self._layout.hidden if k in out.keys(include_nested=True)]
        return out.exclude(*hidden) if hidden else out

    def set_hook(self, cmd: SetHook) -> None:
        """Replace a hook (a replaced profiler is stopped, writing its trace)."""
        import cloudpickle

        if cmd.name not in _HOOKS:  # pragma: no cover - a protocol bug
            raise RuntimeError(f"unknown worker hook {cmd.name!r}")
        hook = cloudpickle.loads(cmd.hook)
        if cmd.name == "profiler" and self.profiler is not None:
            self.profiler.stop()
        setattr(self, cmd.name, hook)

    def close(self) -> None:
        """The worker stops: a profiler still recording writes what it has."""
        if self.profiler is not None:
            self.profiler.stop()

    def answer(self, cmd: RemoteCall) -> Reply:
        """Resolve and run a `RemoteCall`; whatever it raises goes back in the `Reply`, the worker goes on."""
        import cloudpickle

        from .._core._remote import call_path

        try:
            path, args, kwargs = cloudpickle.loads(cmd.request)
            value = call_path(self, path, args, kwargs)
            try:
                return Reply(cmd.seq, cloudpickle.dumps(value))
            except Exception as exc:
                raise TypeError(
                    f"{path!r} gave a {type(value).__name__}, which cannot be pickled to send back ({exc}); "
                    "ask for a picklable part of it"
                ) from exc
        except Exception as exc:
            try:
                payload: bytes | None = pickle.dumps(exc)
            except Exception:
                payload = None
            return Reply(cmd.seq, None, payload, f"{type(exc).__name__}: {exc}", traceback.format_exc())

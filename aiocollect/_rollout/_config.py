"""Argument validation: every rule is checked before any env is built.

Messages follow one grammar: the rule, the value (``!r``) and, where useful, the fix.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .._core._errors import warn_user
from .._core._validate import check_bool, check_int, check_seconds

__all__ = ["CollectorConfig", "check_exploration_type", "validate_config"]


@dataclass(frozen=True)
class CollectorConfig:
    create_env_fn: Any
    create_env_kwargs: dict[str, Any]
    frames_per_batch: int
    total_frames: float  # math.inf when endless
    max_frames_per_traj: int | None
    init_random_frames: int
    reset_at_each_iter: bool
    postproc: Callable[[Any], Any] | None
    split_trajs: bool
    # The value of a tensordict.nn.InteractionType ("random", "mode", ...), kept as a plain
    # str so that unpickling a config in a worker does not import tensordict.
    exploration_type: str
    env_device: torch.device | None
    policy_device: torch.device | None
    storing_device: torch.device | None
    set_truncated: bool
    track_traj_ids: bool
    max_queued_batches: int
    shutdown_timeout: float
    # TorchRL's options (see Collector's docstring for what each does on which env).
    use_buffers: bool | None = None
    compact_obs: bool = False
    trust_policy: bool | None = None
    compile_policy: Any = None
    cudagraph_policy: Any = None
    track_policy_version: Any = False
    return_same_td: bool = False
    no_cuda_sync: bool = False
    auto_register_policy_transforms: bool | None = None
    track_provenance: bool | None = None  # None: on, except for TorchRL envs (their batches keep TorchRL's keys)


def _device(name: str, value: Any) -> torch.device | None:
    if value is None:
        return None
    try:
        return torch.device(value)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"{name} must be a torch.device or a device string like 'cpu' or 'cuda:0', got {value!r}"
        ) from exc


# The values of tensordict.nn.InteractionType (a StrEnum), so a str is checked without
# importing tensordict; anything else asks tensordict itself (a newer release may add values).
_INTERACTION_VALUES = frozenset({"mode", "median", "mean", "random", "deterministic"})


def check_exploration_type(value: Any) -> str:
    """An InteractionType, or its value in any case, as a plain lower-case str."""
    if isinstance(value, str):  # InteractionType members are str too
        v = str.lower(value)
        if v in _INTERACTION_VALUES:
            return v
    from tensordict.nn import InteractionType

    if isinstance(value, str):
        try:
            return str.lower(InteractionType(value.lower()).value)
        except ValueError:
            pass
    choices = ", ".join(t.name for t in InteractionType)
    raise ValueError(f"exploration_type must be a tensordict.nn.InteractionType ({choices}), got {value!r}")


def _env_types() -> tuple[type[Any], ...]:
    """The classes an env instance may have: aiocollect's, and gymnasium's or TorchRL's once loaded.

    A gymnasium env cannot exist before gymnasium was imported, so a process whose envs are
    all aiocollect `BatchedEnv`s never imports it.
    """
    from .._envs._base import AsyncBatchedEnv, BatchedEnv

    types: tuple[type[Any], ...] = (BatchedEnv, AsyncBatchedEnv)
    if "gymnasium" in sys.modules:
        import gymnasium as gym

        types += (gym.Env, gym.vector.VectorEnv)
    if "torchrl" in sys.modules:  # likewise a TorchRL env: torchrl is imported only by its users
        from torchrl.envs import EnvBase

        types += (EnvBase,)
    return types


def _env_fn(value: Any) -> Any:
    if isinstance(value, str):
        import gymnasium as gym

        if value not in gym.envs.registry:
            close = [k for k in gym.envs.registry if k.lower().startswith(value.split("-")[0].lower())][:3]
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise ValueError(
                f"create_env_fn {value!r} is not a registered gymnasium env id{hint}; check the id and version"
            )
        return value
    if isinstance(value, _env_types()) or callable(value):
        return value
    raise TypeError(
        "create_env_fn must be a gymnasium env id, a gymnasium Env or VectorEnv, a TorchRL EnvBase, an aiocollect "
        f"BatchedEnv, or a zero-argument callable returning one, got {value!r}"
    )


def _is_factory(value: Any) -> bool:
    return callable(value) and not isinstance(value, _env_types())


def validate_config(
    *,
    create_env_fn: Any,
    policy: Any,
    frames_per_batch: Any,
    total_frames: Any,
    max_frames_per_traj: Any,
    init_random_frames: Any,
    reset_at_each_iter: Any,
    postproc: Any,
    split_trajs: Any,
    exploration_type: Any,
    reset_when_done: Any,
    device: Any,
    env_device: Any,
    policy_device: Any,
    storing_device: Any,
    create_env_kwargs: Any,
    set_truncated: Any,
    track_traj_ids: Any,
    max_queued_batches: Any,
    shutdown_timeout: Any,
    use_buffers: Any = None,
    compact_obs: Any = False,
    trust_policy: Any = None,
    compile_policy: Any = None,
    cudagraph_policy: Any = None,
    track_policy_version: Any = False,
    return_same_td: Any = False,
    no_cuda_sync: Any = False,
    auto_register_policy_transforms: Any = None,
    track_provenance: Any = None,
) -> CollectorConfig:
    """Check every constructor argument; raise ``TypeError``/``ValueError`` naming rule, value and fix."""
    env_fn = _env_fn(create_env_fn)
    if create_env_kwargs and not (isinstance(env_fn, str) or _is_factory(env_fn)):
        raise ValueError("create_env_kwargs can only be used with an env id or a factory, not an env instance")
    if policy is not None and not callable(policy):
        raise TypeError(f"policy must be None, an nn.Module or a callable, got {policy!r}")
    fpb = check_int("frames_per_batch", frames_per_batch)
    if total_frames is None:
        total_frames = -1
    if isinstance(total_frames, bool) or not isinstance(total_frames, int):
        raise TypeError(f"total_frames must be an int (-1 for endless), got {total_frames!r}")
    if total_frames == 0:
        raise ValueError("total_frames must be positive, or -1 for endless collection, got 0")
    # A budget below one batch gets one batch, with the warning below (TorchRL's rule).
    total = math.inf if total_frames < 0 else float(total_frames)
    if total_frames > 0 and total_frames % fpb:
        warn_user(
            f"total_frames ({total_frames}) is not divisible by frames_per_batch ({fpb}); "
            f"the last batch will take collection to {math.ceil(total_frames / fpb) * fpb} frames",
            UserWarning,
        )
    mfpt = max_frames_per_traj
    if mfpt is not None:
        if isinstance(mfpt, bool) or not isinstance(mfpt, int):
            raise TypeError(f"max_frames_per_traj must be an int or None, got {mfpt!r}")
        mfpt = mfpt if mfpt > 0 else None
    irf = init_random_frames
    if irf is None:
        irf = 0
    check_int("init_random_frames", irf, minimum=-1, rule="an int >= 0 (or -1/None for none)")
    irf = max(irf, 0)
    if reset_when_done is not True:
        raise ValueError(
            f"reset_when_done must be True (envs are always reset when done, as in TorchRL), got {reset_when_done!r}"
        )
    if postproc is not None and not callable(postproc):
        raise TypeError(f"postproc must be a callable taking and returning a TensorDict, or None, got {postproc!r}")
    exploration_type = check_exploration_type(exploration_type)
    if create_env_kwargs is not None and not isinstance(create_env_kwargs, dict):
        raise TypeError(f"create_env_kwargs must be a dict or None, got {create_env_kwargs!r}")
    dev = _device("device", device)
    env_dev = _device("env_device", env_device) or dev
    pol_dev = _device("policy_device", policy_device) or dev
    store_dev = _device("storing_device", storing_device) or dev
    if store_dev is None and env_dev is not None and env_dev == pol_dev:
        store_dev = env_dev
    split = check_bool("split_trajs", bool(split_trajs) if split_trajs is None else split_trajs)
    track = check_bool("track_traj_ids", track_traj_ids)
    if split and not track:
        raise ValueError("split_trajs=True needs track_traj_ids=True, got track_traj_ids=False")
    mqb = check_int("max_queued_batches", max_queued_batches, minimum=0)
    timeout = check_seconds("shutdown_timeout", shutdown_timeout)
    torchrl_options = _torchrl_options(
        use_buffers=use_buffers, compact_obs=compact_obs, trust_policy=trust_policy, compile_policy=compile_policy,
        cudagraph_policy=cudagraph_policy, track_policy_version=track_policy_version, return_same_td=return_same_td,
        no_cuda_sync=no_cuda_sync, auto_register_policy_transforms=auto_register_policy_transforms,
        track_provenance=track_provenance,
    )  # fmt: skip
    return CollectorConfig(
        create_env_fn=env_fn,
        create_env_kwargs=dict(create_env_kwargs or {}),
        frames_per_batch=fpb,
        total_frames=total,
        max_frames_per_traj=mfpt,
        init_random_frames=irf,
        reset_at_each_iter=check_bool("reset_at_each_iter", reset_at_each_iter),
        postproc=postproc,
        split_trajs=split,
        exploration_type=exploration_type,
        env_device=env_dev,
        policy_device=pol_dev,
        storing_device=store_dev,
        set_truncated=check_bool("set_truncated", set_truncated),
        track_traj_ids=track,
        max_queued_batches=mqb or 0,
        shutdown_timeout=timeout,
        **torchrl_options,
    )


def _torchrl_options(**given: Any) -> dict[str, Any]:
    """Check TorchRL's constructor options (the rule, the value, the fix)."""
    for name in ("use_buffers", "trust_policy", "auto_register_policy_transforms", "track_provenance"):
        if given[name] is not None and not isinstance(given[name], bool):
            raise TypeError(f"{name} must be a bool or None, got {given[name]!r}")
    for name in ("compact_obs", "return_same_td", "no_cuda_sync"):
        check_bool(name, given[name])
    for name in ("compile_policy", "cudagraph_policy"):
        value = given[name]
        if value is not None and not isinstance(value, (bool, dict)):
            raise TypeError(f"{name} must be a bool, a dict of keyword arguments or None, got {value!r}")
    tracker = given["track_policy_version"]
    if tracker is None:
        given["track_policy_version"] = False
    elif not isinstance(tracker, bool) and not hasattr(tracker, "increment_version"):
        raise TypeError(f"track_policy_version must be a bool or a TorchRL PolicyVersion transform, got {tracker!r}")
    return given


def make_env(cfg: CollectorConfig) -> Any:
    """Build the env described by ``cfg`` and wrap it as a `BatchedEnv`/`AsyncBatchedEnv` (blocking)."""
    from .._envs._base import AsyncBatchedEnv, BatchedEnv

    fn, kwargs = cfg.create_env_fn, cfg.create_env_kwargs
    env: Any  # a gymnasium, TorchRL or aiocollect env, or whatever a factory returned
    if isinstance(fn, str):
        import gymnasium as gym

        env = gym.make(fn, **kwargs)
    elif isinstance(fn, _env_types()):
        if kwargs:
            raise ValueError("create_env_kwargs can only be used with an env id or a factory, not an env instance")
        env = fn
    else:
        env = fn(**kwargs)
    if isinstance(env, (BatchedEnv, AsyncBatchedEnv)):
        return env
    from .._envs._torchrl import TorchRLEnv, is_torchrl_env

    if is_torchrl_env(env):
        return TorchRLEnv(
            env, max_frames_per_traj=cfg.max_frames_per_traj, track_policy_version=cfg.track_policy_version,
            env_device=cfg.env_device,
        )  # fmt: skip
    if isinstance(env, _env_types()):  # a gymnasium env (aiocollect's were returned above)
        from .._envs._gym import wrap_gymnasium

        try:
            return wrap_gymnasium(env)
        except BaseException:
            env.close()
            raise
    raise TypeError(
        f"create_env_fn returned {type(env).__name__}; it must return a gymnasium Env/VectorEnv, a TorchRL EnvBase "
        "or an aiocollect BatchedEnv"
    )

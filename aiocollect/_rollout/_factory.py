"""Which rollout engine steps an env: TorchRL's semantics for TorchRL envs, aiocollect's otherwise."""

from __future__ import annotations

import math
import threading
from typing import Any

import torch

from .._core._seeding import TrajCounter
from ._config import CollectorConfig
from ._policy import PolicyAdapter

__all__ = ["make_rollout"]


def make_rollout(
    env: Any,
    policy: PolicyAdapter,
    cfg: CollectorConfig,
    *,
    traj_counter: TrajCounter,
    generator: torch.Generator,
    stop: threading.Event,
    worker_id: int = 0,
    storing_device: Any = None,
) -> Any:
    """A `Rollout` (gymnasium and aiocollect envs) or a `TorchRLRollout` (TorchRL envs) for ``env``.

    ``storing_device`` is where batches are allocated (worker processes collect on the
    env/policy devices and let the parent move batches, so they pass ``None``).
    """
    from .._envs._torchrl import TorchRLEnv

    if isinstance(env, TorchRLEnv):
        from ._torchrl import TorchRLOptions, TorchRLRollout
        from ._torchrl_transforms import register_policy_transforms

        register_policy_transforms(env, policy.policy, cfg.auto_register_policy_transforms)
        options = TorchRLOptions(
            set_truncated=cfg.set_truncated, reset_at_each_iter=cfg.reset_at_each_iter,
            policy_device=cfg.policy_device, storing_device=storing_device, track_traj_ids=cfg.track_traj_ids,
            exploration_type=cfg.exploration_type, use_buffers=cfg.use_buffers, compact_obs=cfg.compact_obs,
            trust_policy=cfg.trust_policy, compile_policy=cfg.compile_policy, cudagraph_policy=cfg.cudagraph_policy,
            track_provenance=cfg.track_provenance,
        )  # fmt: skip
        return TorchRLRollout(
            env, policy, steps=math.ceil(cfg.frames_per_batch / max(1, env.numel)), traj_counter=traj_counter,
            generator=generator, options=options, stop=stop, worker_id=worker_id,
        )  # fmt: skip
    from ._rollout import Rollout

    policy.bind(env.spec, counts_steps=cfg.max_frames_per_traj is not None)
    rollout = Rollout(
        env, policy, steps=math.ceil(cfg.frames_per_batch / max(1, env.spec.numel)), traj_counter=traj_counter,
        generator=generator, max_frames_per_traj=cfg.max_frames_per_traj, set_truncated=cfg.set_truncated,
        reset_at_each_iter=cfg.reset_at_each_iter, env_device=cfg.env_device, storing_device=storing_device,
        track_traj_ids=cfg.track_traj_ids, stop=stop, worker_id=worker_id,
    )  # fmt: skip
    rollout.compact = cfg.compact_obs
    if cfg.track_provenance is False:
        rollout.hidden_keys = (("collector", "policy_version"), ("collector", "worker_id"))
    return rollout

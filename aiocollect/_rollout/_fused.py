"""The rollout's step loop fused into one function, for the common case.

`Rollout._run` drives a step through `Rollout.act`, the policy adapter, the env's
``_step_arrays`` and `Rollout._record_fast`: five Python calls and their attribute lookups
per step, which at CartPole's size cost as much as the numpy writes themselves (measured: about
a fifth of the in-process collector's time per frame went to bookkeeping, against a tenth in
the tightest hand-written loop). `run_fused` does the same work with locals bound once per
batch, for the case that covers gymnasium envs with a policy: numpy actions and observations,
no extra policy outputs, no step limit, no forced truncation. Anything else takes the general
path, which stays the reference: both write the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .._envs._base import BatchedEnv

__all__ = ["fused_ok", "one_key_rows", "run_fused"]


def fused_ok(r: Any, random: bool) -> bool:
    """Whether `run_fused` can run this batch of the `Rollout` ``r`` (checked once per batch)."""
    return (
        not random
        and not r.max_steps
        and not r.set_truncated
        and r._numpy_actions
        and r._np_obs
        and r._obs_np is not None
        and not r.extras
        and not r._next_inputs
        and r._cached_views is not None
    )


def run_fused(r: Any, env: BatchedEnv, preempt: Callable[[], bool] | None, interrupted: type[Exception]) -> int:
    """`Rollout._run`'s loop (after `Rollout.begin`, under ``no_grad``); returns the steps taken.

    ``interrupted`` is raised when the collector sets the rollout's ``stop`` event.
    """
    policy = r.policy
    call, lock, versions = policy._call, policy.lock, r.versions
    assert call is not None
    stop_is_set = r.stop.is_set
    views_at = r._cached_views
    assert views_at is not None
    action_keys = r._action_keys
    step, no_done = env._step_arrays, r._no_done
    logical_or = torch.logical_or
    # Vector envs whose step already reset the rows that ended (gymnasium's SAME_STEP) say so,
    # and then hold every row's next input whole: no reset call, no merge.
    autoreset_rows = getattr(env, "_autoreset_rows", None)
    reset_obs = getattr(env, "_reset_obs", None)
    reset_obs_np = None if reset_obs is None else {k: r._np(v) for k, v in reset_obs.items()}
    start_trajs = r.start_trajs
    # The adapter's one-call step for a single numpy action (gymnasium's plain spaces).
    step_numpy = (
        getattr(env, "_step_numpy", None) if len(action_keys) == 1 and getattr(env, "_step_numpy_ok", False) else None
    )
    if step_numpy is not None and call == policy._call_one and len(views_at[0].obs_np) == 1:
        return _run_one_key(r, env, step_numpy, preempt, interrupted, reset_obs, reset_obs_np, autoreset_rows)
    for t in range(r.T):
        # A preempted batch still takes its first step (TorchRL checks after each step).
        if t and preempt is not None and preempt():
            return t
        if stop_is_set():
            raise interrupted
        with lock:  # as PolicyAdapter.__call__ (the caller already runs under no_grad)
            versions.append(policy.version)
            out = call(r.obs)
        views = r._step_views = views_at[t]
        obs_np = r._obs_np
        for k, dst_np in views.obs_np:
            dst_np[...] = obs_np[k]
        action: dict[Any, Any] = {}
        out_np = views.out_np
        for k in action_keys:
            a = out[k]
            # Asked, not tried: a numpy() that raises costs an exception per step (8% of the
            # collector's time with a CUDA policy, profiled on an H200).
            if not a.is_cpu or a.requires_grad:
                a = a.detach().cpu()
            a_np = a.numpy()
            out_np[k][...] = a_np
            action[k] = a_np
        if views.traj_np is not None:
            views.traj_np[...] = r._traj_np
        if step_numpy is not None:
            ended = step_numpy(a_np, views)
            r.steps_done += 1
            if ended is False:  # no row ended
                r.obs, r._obs_np = views.next_obs, views.next_obs_np
                continue
            if ended is not None:  # the rows the step reset, and every row's next input
                r.obs, r._obs_np = reset_obs, reset_obs_np
                start_trajs(ended)
                continue
            r.obs, r._obs_np = views.next_obs, views.next_obs_np
        else:
            obs, reward, term, trunc = step(action, views)
            # Rollout._record_fast, inline (adapters that honour ``out`` wrote the step in place
            # and hand the storage's own tensors back: then there is nothing to copy).
            next_obs = views.next_obs
            if obs is not next_obs:
                for k, dst in next_obs.items():
                    if obs[k] is not dst:
                        dst.copy_(obs[k])
            for k, dst in views.next_extra:
                dst.copy_(obs[k])
            flags = views.flags
            if reward is not flags[0]:
                rew, term_dst, trunc_dst, done = flags
                rew.copy_(reward)
                term_dst.copy_(term)
                trunc_dst.copy_(trunc)
                logical_or(term, trunc, out=done)
            r.obs, r._obs_np = next_obs, views.next_obs_np
            r.steps_done += 1
        done_np = views.flags_np[3]
        if done_np.tobytes() != no_done:
            _restart_ended(r, env, views, done_np, autoreset_rows, reset_obs, reset_obs_np)
    return r.T


def _restart_ended(
    r: Any, env: BatchedEnv, views: Any, done_np: Any, autoreset_rows: Any, reset_obs: Any, reset_obs_np: Any
) -> None:
    """The rows that ended this step start over (both bodies, once ``done`` holds a row).

    Taken whole when the step already reset them (gymnasium's SAME_STEP: every row's next
    input is then ``reset_obs``, as `Rollout._apply_reset_np` takes a whole reset observation),
    else reset now.
    """
    rows = None if autoreset_rows is None else autoreset_rows(done_np)
    if rows is None:
        mask = done_np if env._numpy_masks else views.flags[3]
        r.apply_reset(env._reset_arrays(mask, None), mask)
        return
    r.obs, r._obs_np = reset_obs, reset_obs_np
    r.start_trajs(rows)


def one_key_rows(r: Any) -> list[tuple[Any, ...]]:
    """Per step, the slices `_run_one_key` writes, taken out of the rollout's cached views once.

    ``(views, obs, action, traj, done, next obs tensor, next obs array)``; kept on the
    rollout until its storage changes (its cached views are then new objects).
    """
    views_at = r._cached_views
    cache = getattr(r, "_fused_rows", None)  # set here; dropped with the views (`Rollout.drop_views`)
    if cache is not None and cache[0] is views_at:
        return cache[1]
    (key,) = r.policy.action_keys
    okey = r.policy._obs_key
    rows = [
        (v, v.obs_np[0][1], v.out_np[key], v.traj_np, v.flags_np[3], v.next_obs[okey], v.next_obs_np[okey])
        for v in views_at
    ]
    r._fused_rows = (views_at, rows)
    return rows


def _run_one_key(
    r: Any,
    env: BatchedEnv,
    step_numpy: Callable[[Any, Any], Any],
    preempt: Callable[[], bool] | None,
    interrupted: type[Exception],
    reset_obs: Any,
    reset_obs_np: Any,
    autoreset_rows: Callable[[Any], Any] | None,
) -> int:
    """`run_fused` for one observation array, one action array and a plain module policy.

    What most gymnasium envs are (CartPole, Pendulum, MuJoCo's, Atari's): the policy module is
    called on the observation tensor itself, and each step writes through slices taken once
    (`one_key_rows`), with no dict built per step. At one env per step the per-step dicts and
    key loops of `run_fused` were a quarter of the collector's own work (about 1 us of 4, with
    an env and a policy that cost nothing).
    """
    policy = r.policy
    module, lock, versions = policy.policy, policy.lock, r.versions
    okey = policy._obs_key
    stop_is_set, start_trajs = r.stop.is_set, r.start_trajs
    no_done = r._no_done
    rows = one_key_rows(r)
    obs_t, obs_np = r.obs[okey], r._obs_np[okey]
    for t in range(r.T):
        # A preempted batch still takes its first step (TorchRL checks after each step).
        if t and preempt is not None and preempt():
            return t
        if stop_is_set():
            raise interrupted
        views, obs_dst, act_dst, traj_dst, done_np, next_t, next_np = rows[t]
        r._step_views = views
        with lock:  # as PolicyAdapter.__call__ (the caller already runs under no_grad)
            versions.append(policy.version)
            a = module(obs_t)
        obs_dst[...] = obs_np
        # Asked, not tried: a numpy() that raises costs an exception per step.
        if not a.is_cpu or a.requires_grad:
            a = a.detach().cpu()
        a_np = a.numpy()
        act_dst[...] = a_np
        if traj_dst is not None:
            traj_dst[...] = r._traj_np
        ended = step_numpy(a_np, views)
        r.steps_done += 1
        if ended is False:  # no row ended: the next input is this step's next observation
            r.obs, r._obs_np = views.next_obs, views.next_obs_np
            obs_t, obs_np = next_t, next_np
            continue
        if ended is not None:  # the rows the step reset, and every row's next input
            r.obs, r._obs_np = reset_obs, reset_obs_np
            start_trajs(ended)
        else:
            r.obs, r._obs_np = views.next_obs, views.next_obs_np
            if done_np.tobytes() != no_done:
                _restart_ended(r, env, views, done_np, autoreset_rows, reset_obs, reset_obs_np)
        obs_t, obs_np = r.obs[okey], r._obs_np[okey]
    return r.T

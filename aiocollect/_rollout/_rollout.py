"""The rollout engine: steps one batched env with one policy into a preallocated batch.

Storage is time-major (``[T, *B, ...]``) so each step writes one contiguous slice; the batch
end moves time to the last batch dim while making the one copy the caller gets to keep.

The engine is a small step machine (`begin`, `act`, `record`, `apply_reset`) driven by two
loops: `_run` (behind `collect_into` and `collect`) runs in a worker thread or process for
synchronous envs, `acollect` runs on the event loop for async envs (with the policy sent to a
thread). Per-step writes go through cached numpy views of the storage: at these sizes a numpy
write costs a fraction of a torch one. Only `collect` and `acollect`, which return a
TensorDict, import tensordict.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._core._seeding import TrajCounter
from .._envs._base import AsyncBatchedEnv, BatchedEnv, StepArrays, StepOut
from .._envs._specs import ArraySpec, NestedKey
from ._arrays import expand_mask as _expand
from ._arrays import next_key as _nxt
from ._arrays import np_views as _np_views
from ._arrays import numpy_or_none as _numpy
from ._fused import fused_ok, run_fused
from ._output import RolloutOutput
from ._policy import PolicyAdapter

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["Interrupted", "Rollout", "TrajCounter"]

_CACHED_STEPS = 4096


class Interrupted(Exception):
    """The collector asked the rollout to stop between two steps."""


class Rollout(RolloutOutput):
    """Collects ``steps`` steps per batch from ``env`` with ``policy``.

    Args:
        env: The batched env (sync or async).
        policy: The bound `PolicyAdapter`.
        steps: Time steps ``T`` per batch.
        traj_counter: Where new trajectory ids come from.
        generator: The CPU generator of random actions.
        max_frames_per_traj: Truncate trajectories after this many steps (``None``: never).
        set_truncated: Mark the last step of every batch truncated (without a reset).
        reset_at_each_iter: Reset every env at the start of every batch.
        env_device: Device actions are moved to before a (non-gymnasium) env step.
        storing_device: Device of the batches `collect` allocates.
        track_traj_ids: Record ``("collector", "traj_ids")``.
        stop: Set to end the batch at the next step (`Interrupted`).
        worker_id: Written to ``("collector", "worker_id")``.
    """

    def __init__(
        self,
        env: BatchedEnv | AsyncBatchedEnv,
        policy: PolicyAdapter,
        *,
        steps: int,
        traj_counter: TrajCounter,
        generator: torch.Generator,
        max_frames_per_traj: int | None,
        set_truncated: bool,
        reset_at_each_iter: bool,
        env_device: torch.device | None,
        storing_device: torch.device | None,
        track_traj_ids: bool,
        stop: threading.Event,
        worker_id: int = 0,
    ) -> None:
        self.env, self.policy, self.T = env, policy, steps
        self.spec = env.spec
        self.B = tuple(env.spec.batch_size)
        self.nb = len(self.B)
        self.counter, self.generator = traj_counter, generator
        self.max_steps, self.set_truncated = max_frames_per_traj, set_truncated
        self.reset_at_each_iter, self.track_traj_ids = reset_at_each_iter, track_traj_ids
        self.env_device, self.storing_device, self.worker_id = env_device, storing_device, worker_id
        self.stop = stop
        self.obs: dict[NestedKey, torch.Tensor] = {}
        self._obs_np: dict[NestedKey, np.ndarray] | None = None  # numpy views of self.obs, if CPU
        self._carrier: dict[NestedKey, torch.Tensor] = {}
        self._carrier_np: dict[NestedKey, np.ndarray] = {}
        self._np_cache: dict[int, tuple[torch.Tensor, np.ndarray]] = {}
        self.traj_ids = torch.zeros(self.B, dtype=torch.int64)
        self._traj_np = self.traj_ids.numpy()
        self.step_count = torch.zeros(self.B, dtype=torch.int64)
        self._steps_np = self.step_count.numpy()
        self._no_done = bytes(max(1, int(np.prod(self.B))))  # a done mask's bytes when no row is done
        self.needs_reset = True
        self.seeds: list[int] | None = None
        self.buf: dict[NestedKey, torch.Tensor] | None = None
        self.flat: dict[str, torch.Tensor] = {}
        self.extras: list[NestedKey] = []
        # Policy outputs under ("next", <observation key>) (a TorchRL recurrent state) that the
        # env takes with the action, for envs that ask for them (TorchRL's, which carry them on).
        self._next_inputs: list[NestedKey] = []
        self.checked = False
        self._action_keys = list(env.spec.action)
        # Gymnasium adapters take numpy actions: then the rollout converts each action once.
        self._numpy_actions = bool(getattr(env, "_numpy_actions", False))
        self.steps_done = 0  # for error reports: the step at which an env or policy failed
        self.versions: list[int] = []
        # Set by a worker process's loop (its shared slots, control words, replay storage).
        self.slots: list[dict[Any, torch.Tensor]] = []
        self.control: Any = None
        self.storage: dict[Any, torch.Tensor] | None = None

    # -- state changes requested by the collector (applied at the next batch) --------------
    def request_reset(self, seeds: list[int] | None = None) -> None:
        """Reset every env at the start of the next batch (with one seed per env, if given)."""
        self.needs_reset = True
        if seeds is not None:
            self.seeds = seeds

    # -- step machine ------------------------------------------------------------------------
    def pending_reset(self) -> bool:
        return self.needs_reset or self.reset_at_each_iter

    def _apply_reset_np(self, reset_obs: dict[NestedKey, torch.Tensor], mask: np.ndarray) -> None:
        # The numpy twin of the masked branch of `apply_reset` (same results, fewer dispatches:
        # it runs at every episode end). Rows are flat indices of the batch.
        rows: Any = () if mask.ndim == 0 else np.flatnonzero(mask)  # (): a single env's whole row
        if len(rows) == 1:
            rows = int(rows[0])  # plain indexing: a fraction of the cost of fancy indexing
        if self.env._reset_full:
            # Every row's next observation, unchanged until the env's next step (which comes
            # after act() copied it into the storage): nothing to merge.
            self.obs, self._obs_np = reset_obs, {k: self._np(v) for k, v in reset_obs.items()}
        else:
            self._merge_reset_np(reset_obs, mask, rows)
        self.start_trajs(rows)

    def start_trajs(self, rows: Any) -> None:
        """New trajectory ids and zero step counts for ``rows`` (flat indices, one int, or ``()``)."""
        ids, steps = self._traj_np, self._steps_np
        if isinstance(rows, tuple):  # a single env: 0-d, indexed by ()
            ids[()], steps[()] = self.counter.take_one(), 0
            return
        if ids.ndim != 1:
            ids, steps = ids.reshape(-1), steps.reshape(-1)  # views: flat rows
        if isinstance(rows, np.ndarray):
            if len(rows) != 1:
                ids[rows], steps[rows] = self.counter.take_np(len(rows)), 0
                return
            rows = int(rows[0])  # plain indexing: a fraction of the cost of fancy indexing
        ids[rows], steps[rows] = self.counter.take_one(), 0

    def _merge_reset_np(self, reset_obs: dict[NestedKey, torch.Tensor], mask: np.ndarray, rows: Any) -> None:
        """The reset rows of ``reset_obs`` over the current observation, into the carrier."""
        carrier, carrier_np, obs_np = self._carrier, self._carrier_np, self._obs_np
        for k, v in self.obs.items():
            c, dst = carrier.get(k), carrier_np.get(k)
            if c is None or dst is None or c.shape != v.shape or c.dtype != v.dtype:
                c = carrier[k] = torch.empty_like(v)
                dst = carrier_np[k] = c.numpy()
            src = self._np(reset_obs[k])
            if mask.ndim == 0:
                dst[...] = src
                continue
            dst[...] = obs_np[k] if obs_np is not None else v.numpy()
            if self.nb == 1:
                dst[rows] = src[rows]
            else:
                np.copyto(dst, src, where=mask.reshape(mask.shape + (1,) * (dst.ndim - mask.ndim)))
        self.obs, self._obs_np = dict(carrier), dict(carrier_np)

    def _np(self, t: torch.Tensor) -> np.ndarray:
        """A numpy view of ``t``, cached (an adapter's reset buffers are reused every step)."""
        hit = self._np_cache.get(id(t))
        if hit is None or hit[0] is not t:
            hit = self._np_cache[id(t)] = (t, t.numpy())
        return hit[1]

    def apply_reset(self, reset_obs: dict[NestedKey, torch.Tensor], mask: Any) -> None:
        if isinstance(mask, np.ndarray):
            self._apply_reset_np(reset_obs, mask)
            return
        if mask is None:
            self.obs = {k: v.clone() for k, v in reset_obs.items()}
            self._obs_np = _numpy(self.obs)
            self.traj_ids = self.counter.take(max(1, int(np.prod(self.B)))).reshape(self.B)
            self._traj_np = self.traj_ids.numpy()
            self.step_count.zero_()
            self.needs_reset, self.seeds = False, None
            return
        # self.obs is a view of the batch storage (the step's recorded next observation), so
        # the mixed observation goes to a separate carrier, reused from step to step: the
        # previous carrier was copied into the storage by act() since it was last written.
        carrier = self._carrier
        for k, v in self.obs.items():
            c = carrier.get(k)
            if c is None or c.shape != v.shape or c.dtype != v.dtype:
                c = carrier[k] = torch.empty_like(v)
                self._carrier_np.pop(k, None)
            torch.where(_expand(mask, v), reset_obs[k], v, out=c)
        self.obs = dict(carrier)
        self._obs_np = _numpy(self.obs)
        self.traj_ids.masked_scatter_(mask, self.counter.take(int(mask.sum())))
        self.step_count.masked_fill_(mask, 0)

    def _allocate(self, first: dict[NestedKey, torch.Tensor] | None) -> None:
        T, B = self.T, self.B
        specs: dict[NestedKey, ArraySpec] = dict(self.spec.observation)
        specs.update(self.spec.action)
        if first is not None:
            nxt = {_nxt(k) for k in self.spec.observation}  # recorded from the env's output
            self.extras = [k for k in first if k not in self.spec.action and k not in nxt]
            self._next_inputs = [k for k in first if k in nxt] if getattr(self.env, "_takes_next", False) else []
            for k in self.extras:
                v = first[k]
                specs[k] = ArraySpec(tuple(v.shape[self.nb :]), v.dtype)
        buf = {k: s.zeros((T, *B)) for k, s in specs.items()}
        for k, s in (*self.spec.observation.items(), *self.spec.next_only.items()):
            buf[_nxt(k)] = s.zeros((T, *B))
        for k, dtype in (
            ("reward", torch.float32),
            ("done", torch.bool),
            ("terminated", torch.bool),
            ("truncated", torch.bool),
        ):
            buf[("next", k)] = torch.zeros((T, *B, 1), dtype=dtype)
        if self.track_traj_ids:
            buf[("collector", "traj_ids")] = torch.zeros((T, *B), dtype=torch.int64)
        if self.max_steps:
            buf["step_count"] = torch.zeros((T, *B, 1), dtype=torch.int64)
            buf[("next", "step_count")] = torch.zeros((T, *B, 1), dtype=torch.int64)
        self.pinned = frozenset(self._keys_to_pin(buf))
        for k in self.pinned:
            buf[k] = buf[k].pin_memory()
        self.buf = buf
        # [T, *B] views of the [T, *B, 1] entries, so per-step writes need no reshape.
        self.flat = {k: buf[("next", k)].squeeze(-1) for k in ("reward", "done", "terminated", "truncated")}
        if self.max_steps:
            self.flat["step_count"] = buf["step_count"].squeeze(-1)
            self.flat["next_step_count"] = buf[("next", "step_count")].squeeze(-1)
        # Numpy twins of the storage (every key numpy can hold: not bfloat16, for instance).
        self._buf_np = _np_views(buf)
        self._np_obs = all(k in self._buf_np and _nxt(k) in self._buf_np for k in self.spec.observation)
        # Every step writes the same slices: make their views once, not ~15 per step (for
        # batches of up to _CACHED_STEPS steps; longer ones make them as they go).
        self._cached_views = [self._make_views(t) for t in range(T)] if T <= _CACHED_STEPS else None

    def _keys_to_pin(self, buf: dict[NestedKey, torch.Tensor]) -> list[NestedKey]:
        """The storage entries worth pinning (page-locked host memory) for the GPU's copies."""
        store = self.storing_device
        if store is not None and store.type == "cuda":
            # Every entry goes to the GPU at each batch's end (`_write_out`): pinned and
            # contiguous, each is one DMA.
            return list(buf)
        dev = self.policy.device
        if dev is not None and dev.type == "cuda" and self._numpy_actions:
            # The policy's inputs are these rows (each step's next observation): pinned, its
            # non_blocking copy to the GPU is one DMA, not a staged pageable copy (5-8% of the
            # collector's time, profiled on an H200). Safe without an event: the action comes
            # back to the host every step, after the copy, long before a later batch rewrites the row.
            return [_nxt(k) for k in self.spec.observation]
        return []

    def _make_views(self, t: int) -> StepOut:
        buf, buf_np = self.buf, self._buf_np
        assert buf is not None
        # [t, ...] keeps 0-d slices (a single env's) as writable numpy views, not scalars.
        obs_keys = list(self.spec.observation)
        next_obs = {k: buf[_nxt(k)][t] for k in obs_keys}
        flags = tuple(self.flat[k][t] for k in ("reward", "terminated", "truncated", "done"))
        out_keys = (*self.spec.action, *self.extras)
        traj = ("collector", "traj_ids")
        return StepOut(
            obs=[(k, buf[k][t]) for k in obs_keys],
            out=[(k, buf[k][t]) for k in out_keys],
            next_obs=next_obs,
            flags=flags,  # type: ignore[arg-type]
            traj=buf[traj][t] if self.track_traj_ids else None,
            next_obs_np={k: buf_np[_nxt(k)][t, ...] for k in obs_keys if _nxt(k) in buf_np},
            flags_np=tuple(f.numpy() for f in flags),  # type: ignore[arg-type]
            obs_np=[(k, buf_np[k][t, ...]) for k in obs_keys if k in buf_np],
            out_np={k: buf_np[k][t, ...] for k in out_keys if k in buf_np},
            traj_np=buf_np[traj][t, ...] if traj in buf_np else None,
            next_extra=[(k, buf[_nxt(k)][t]) for k in self.spec.next_only],
        )

    def drop_views(self) -> None:
        """Free the per-step views of the storage (a few thousand small tensors): the rollout is done."""
        self._cached_views = self._fused_rows = None

    def views(self, t: int) -> StepOut:
        """The storage slices step ``t`` writes."""
        cached = self._cached_views
        return cached[t] if cached is not None else self._make_views(t)

    def begin(self, random: bool) -> None:
        self.versions = []
        if not random and not self.policy.is_random and not self.checked:
            # Dry run on the real first observation: learns extra output keys and checks the
            # action's shape and dtype before any frame is recorded.
            first = self._policy(self.obs)
            self.policy.check(first)
            self.checked, self.versions = True, []
            self._allocate(first)
        elif self.buf is None:
            self._allocate(None)
        if random:
            for k in self.extras:
                self.buf[k].zero_()  # type: ignore[index]

    def _policy(self, obs: dict[NestedKey, torch.Tensor]) -> dict[NestedKey, torch.Tensor]:
        return self.policy(obs, self.versions)

    def _sample(self) -> dict[NestedKey, torch.Tensor]:
        self.versions.append(self.policy.version)
        return {k: s.sample(self.generator, self.B) for k, s in self.spec.action.items()}

    def act(self, t: int, random: bool) -> dict[NestedKey, Any]:
        """Run the policy on the current observation and record both; returns the env's action."""
        if self.stop.is_set():
            raise Interrupted
        out = self._sample() if random else self._policy(self.obs)
        views = self._step_views = self.views(t)  # record() writes the same step's slices
        obs_np = self._obs_np
        if obs_np is not None and self._np_obs:  # numpy writes cost a fraction of torch ones here
            for k, dst_np in views.obs_np:
                dst_np[...] = obs_np[k]
        else:
            obs = self.obs
            for k, dst in views.obs:
                dst.copy_(obs[k])
        action: dict[NestedKey, Any] = {}
        for i, k in enumerate(self._action_keys):  # views.out lists the action keys first
            a = out[k]
            if self._numpy_actions:
                # The env wants numpy anyway: one conversion serves the storage and the env.
                if a.device.type != "cpu" or a.requires_grad:  # asked, not tried: see _fused
                    a = a.detach().cpu()
                a_np = a.numpy()
                views.out_np[k][...] = a_np  # gymnasium's action dtypes are all numpy's
                action[k] = a_np
            else:
                views.out[i][1].copy_(a)
                action[k] = a if self.env_device is None else a.to(self.env_device)
        if self.extras:
            for k, dst in views.out[len(self._action_keys) :]:
                if k in out:
                    dst.copy_(out[k])
        for k in self._next_inputs:
            if k in out:
                action[k] = out[k]
        if views.traj_np is not None:
            views.traj_np[...] = self._traj_np
        if self.max_steps:
            self.flat["step_count"][t].copy_(self.step_count)
        return action

    def record(self, t: int, step: StepArrays) -> torch.Tensor | None:
        if not self.max_steps and not (self.set_truncated and t == self.T - 1):
            return self._record_fast(t, step)
        obs, reward, term, trunc = step
        buf, flat = self.buf, self.flat
        assert buf is not None
        for k, v in obs.items():  # the observations and the spec's next_only entries
            buf[_nxt(k)][t].copy_(v)
        flat["reward"][t].copy_(reward)
        if self.max_steps:
            self.step_count += 1
            flat["next_step_count"][t].copy_(self.step_count)
            trunc = trunc | (self.step_count >= self.max_steps)
        done = term | trunc
        flat["terminated"][t].copy_(term)
        if self.set_truncated and t == self.T - 1:
            # Marks the batch end as a truncation without resetting: the trajectory goes on.
            flat["truncated"][t].fill_(True)
            flat["done"][t].fill_(True)
        else:
            flat["truncated"][t].copy_(trunc)
            flat["done"][t].copy_(done)
        # The next step's observation is this step's next observation: a view, no copy.
        views = self.views(t)
        self.obs, self._obs_np = views.next_obs, views.next_obs_np if self._np_obs else None
        return done if bool(done.any()) else None

    def _record_fast(self, t: int, step: StepArrays) -> Any:
        """`record` for the common case: no step limit and no forced truncation.

        Returns the done mask (a numpy view when the env takes numpy masks) or ``None``.
        """
        obs, reward, term, trunc = step
        views = self._step_views
        for k, dst in views.next_obs.items():
            if obs[k] is not dst:  # adapters that honour ``out`` already wrote it here
                dst.copy_(obs[k])
        for k, dst in views.next_extra:
            dst.copy_(obs[k])
        rew, term_dst, trunc_dst, done = views.flags
        if reward is not rew:
            rew.copy_(reward)
            term_dst.copy_(term)
            trunc_dst.copy_(trunc)
            torch.logical_or(term, trunc, out=done)
        # The next step's observation is this step's next observation: a view, no copy.
        self.obs, self._obs_np = views.next_obs, views.next_obs_np if self._np_obs else None
        done_np = views.flags_np[3]
        if done_np.tobytes() == self._no_done:
            return None
        return done_np if self.env._numpy_masks else done

    # -- the two loops ---------------------------------------------------------------------
    def prepare(self) -> None:
        """Reset and allocate now (with the policy dry run), so `output_layout` is known."""
        env = self.env
        assert isinstance(env, BatchedEnv)
        if self.pending_reset():
            self.apply_reset(env._reset_arrays(None, self.seeds), None)
        self.begin(self.policy.is_random)

    def _run(self, random: bool, preempt: Callable[[], bool] | None) -> int:
        """Step the sync env through one batch into the storage; returns the steps taken."""
        random = random or self.policy.is_random
        env = self.env
        assert isinstance(env, BatchedEnv)
        # One no_grad for the whole batch (as TorchRL's rollout), not one per policy call.
        with torch.no_grad():
            if self.pending_reset():
                self.apply_reset(env._reset_arrays(None, self.seeds), None)
            self.begin(random)
            if fused_ok(self, random):
                return run_fused(self, env, preempt, Interrupted)
            T, plain = self.T, not self.max_steps
            last = T - 1 if self.set_truncated else T
            for t in range(T):
                # A preempted batch still takes its first step (TorchRL checks after each step).
                if t and preempt is not None and preempt():
                    return t
                action = self.act(t, random)
                if plain and t != last:
                    # The adapter may write the step straight into the storage (``out``).
                    done = self._record_fast(t, env._step_arrays(action, self._step_views))
                else:
                    done = self.record(t, env._step_arrays(action, None))
                self.steps_done += 1
                if done is not None:
                    self.apply_reset(env._reset_arrays(done, None), done)
        return T

    def collect_into(
        self, random: bool, out: dict[Any, torch.Tensor], preempt: Callable[[], bool] | None = None
    ) -> int:
        """Collect one batch straight into ``out``, never building a TensorDict (blocking).

        Args:
            random: Take random actions (also when the policy is ``None``).
            out: One tensor per entry of `output_layout`, keyed alike (e.g. shared-memory
                slots or replay-buffer rows); each is overwritten.
            preempt: Polled before every step but the first; once it returns True the batch ends early:
                the missing steps are zeroed, with trajectory id and policy version ``-1``.

        Returns:
            The number of time steps collected (``T`` unless preempted).
        """
        steps = self._run(random, preempt)
        self._write_out(out, steps)
        return steps

    def collect(
        self, random: bool, out: dict[Any, torch.Tensor] | None = None, preempt: Callable[[], bool] | None = None
    ) -> TensorDict:
        """Collect one batch (blocking; runs in a worker thread or process) as a TensorDict.

        Like `collect_into`, but returns the batch as a ``[*B, T]`` TensorDict over ``out``
        (allocated on ``storing_device`` when ``None``).
        """
        return self._wrap(out, self._run(random, preempt))

    async def acollect(
        self, random: bool, run_sync: Callable[..., Awaitable[Any]], out: dict[Any, torch.Tensor] | None = None
    ) -> TensorDict:
        """Collect one batch from an async env on the event loop; the policy runs via ``run_sync``."""
        random = random or self.policy.is_random
        env = self.env
        assert isinstance(env, AsyncBatchedEnv)
        if self.pending_reset():
            self.apply_reset(await env._reset_arrays(None, self.seeds), None)
        await run_sync(self.begin, random)
        for t in range(self.T):
            action = self.act(t, random) if random else await run_sync(self.act, t, random)
            done = self.record(t, await env._step_arrays(action))
            self.steps_done += 1
            if done is not None:
                self.apply_reset(await env._reset_arrays(done, None), done)
        return await run_sync(self._wrap, out, self.T)

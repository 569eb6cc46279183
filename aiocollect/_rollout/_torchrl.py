"""The rollout engine for TorchRL envs: TorchRL's collector semantics, on TensorDicts.

A TorchRL env is stepped as TorchRL's ``Collector`` steps it: one carrier TensorDict goes
through the policy (wrapped as TorchRL wraps it) and ``env.step_and_maybe_reset``; each step's
carrier is recorded, and the batch is their stack along a last ``"time"`` dim, written into a
preallocated TensorDict (``use_buffers``) or stacked as it comes (dynamic or heterogeneous
specs). So batches keep what only TensorDicts carry: nested groups with batch dims of their
own, lazily stacked heterogeneous envs, non-tensor entries, the policy's outputs as it wrote
them (dtypes and shapes untouched). Private (``_``-prefixed) entries are dropped, as TorchRL
drops them. aiocollect adds ``("collector", "policy_version")`` and ``("collector",
"worker_id")`` to every frame.

The engine has the interface of `Rollout` (``collect``, ``collect_into``, ``output_layout``,
``request_reset``, ...), so collectors and worker processes run it unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from .._core._seeding import TrajCounter
from .._envs._torchrl import TorchRLEnv
from ._layout import BatchLayout, nested_batch_dims
from ._output import version_column
from ._policy import PolicyAdapter
from ._rollout import Interrupted
from ._torchrl_policy import TorchRLPolicy

__all__ = ["TorchRLOptions", "TorchRLRollout"]

_TRAJ, _VERSION, _WORKER = ("collector", "traj_ids"), ("collector", "policy_version"), ("collector", "worker_id")


@dataclass(frozen=True)
class TorchRLOptions:
    """What the collector's arguments ask of a TorchRL rollout (see `Collector`)."""

    set_truncated: bool = False
    reset_at_each_iter: bool = False
    policy_device: torch.device | None = None
    storing_device: torch.device | None = None
    track_traj_ids: bool = True
    exploration_type: str = "random"
    use_buffers: bool | None = None
    compact_obs: bool = False
    trust_policy: bool | None = None
    compile_policy: Any = None
    cudagraph_policy: Any = None
    track_provenance: bool | None = None


def _is_private(key: Any) -> bool:
    return any(k.startswith("_") for k in ((key,) if isinstance(key, str) else key))


def _ends_with(key: Any, name: str) -> bool:
    return (key if isinstance(key, str) else key[-1]) == name


def _with_last(key: Any, name: str) -> Any:
    return name if isinstance(key, str) else (*key[:-1], name)


class TorchRLRollout:
    """Collects ``steps`` steps per batch from a TorchRL env (see the module docstring).

    Args:
        env: The `TorchRLEnv` (its transforms already appended).
        policy: The `PolicyAdapter` of the collector (its policy, copy and version).
        steps: Time steps ``T`` per batch.
        traj_counter: Where new trajectory ids come from.
        generator: Kept for the collectors' seeding (TorchRL's random actions use torch's RNG).
        options: The collector's arguments that shape the rollout.
        stop: Set to end the batch at the next step (`Interrupted`).
        worker_id: Written to ``("collector", "worker_id")``.
    """

    def __init__(
        self,
        env: TorchRLEnv,
        policy: PolicyAdapter,
        *,
        steps: int,
        traj_counter: TrajCounter,
        generator: torch.Generator,
        options: TorchRLOptions,
        stop: threading.Event,
        worker_id: int = 0,
    ) -> None:
        self.env, self.policy, self.T, self.options = env, policy, steps, options
        self.base = env.env
        self.B = env.batch_size
        self.nb = len(self.B)
        self.spec = SimpleNamespace(numel=env.numel, batch_size=torch.Size(self.B))
        self.counter, self.generator, self.stop, self.worker_id = traj_counter, generator, stop, worker_id
        self.steps_done = 0
        self.versions: list[int] = []
        self.needs_reset = True
        self.seeds: list[int] | None = None
        self.buf: Any = None  # the preallocated batch (use_buffers), built by `prepare`
        self._carrier: Any = None
        self._pol = TorchRLPolicy(policy, env, options)
        self._truncated_keys = self._find_truncated_keys() if options.set_truncated else []
        self._compact: tuple[Any, ...] = ()
        if options.compact_obs:
            base = self.base
            keys = [*base._observation_keys_step_mdp, *base._state_keys_step_mdp]
            self._compact = tuple(("next", *((k,) if isinstance(k, str) else k)) for k in keys)
        dynamic = bool(getattr(self.base, "_has_dynamic_specs", False))
        self.use_buffers = (not dynamic) if options.use_buffers is None else options.use_buffers
        self._private: list[Any] = []
        self._layout: BatchLayout | None = None
        # TorchRL's rule: a carrier with no device, unless policy and env share one.
        self._no_device = options.policy_device != self.base.device or self.base.device is None
        # TorchRL's batches have no worker id or version per frame: kept for the collector's own
        # use (preemption, version remapping), left out of what it delivers unless asked for.
        self.hidden_keys: tuple[Any, ...] = () if options.track_provenance else (_VERSION, _WORKER)

    def _find_truncated_keys(self) -> list[Any]:
        keys = [k for k in self.base.done_keys if _ends_with(k, "truncated")]
        if not keys:
            raise RuntimeError(
                "set_truncated=True needs truncated entries in the env's done spec, and this env has none; add "
                "them with env.add_truncated_keys() before passing the env to the collector"
            )
        return keys

    # -- state changes requested by the collector (applied at the next batch) --------------
    def request_reset(self, seeds: list[int] | None = None) -> None:
        """Reset every env at the start of the next batch (seeding the env first, if given)."""
        self.needs_reset = True
        if seeds is not None:
            self.seeds = seeds

    def _reset(self) -> None:
        if self.seeds is not None:
            self.env.set_seed(int(self.seeds[0]))
        carrier = self.base.reset()
        if self._no_device:
            carrier.clear_device_()
        elif carrier.device != self.base.device:  # an env whose reset leaves the device unset
            carrier = carrier.to(self.base.device)
        if self.options.track_traj_ids:
            ids = self.counter.take(max(1, self.env.numel)).reshape(self.B)
            carrier.set(_TRAJ, ids.to(self.options.storing_device) if self.options.storing_device else ids)
        self._carrier = carrier
        self.needs_reset, self.seeds = False, None

    def _new_trajectories(self, env_output: Any) -> None:
        from torchrl.envs.utils import _aggregate_end_of_traj

        ended = _aggregate_end_of_traj(env_output.get("next"), done_keys=self.base.done_keys)
        if not ended.any():
            return
        ids = self._carrier.get(_TRAJ)
        ended = ended.to(ids.device).reshape(ids.shape)
        fresh = self.counter.take(int(ended.sum())).to(ids.device)
        self._carrier.set(_TRAJ, ids.masked_scatter(ended, fresh).reshape(ids.shape))

    # -- preparation ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Reset, wrap and dry-run the policy, allocate the batch: `output_layout` is then known."""
        if self.needs_reset:
            self._reset()
        if self._layout is not None:
            return
        template = self._pol.setup(self._carrier, with_template=self.use_buffers)
        if self.use_buffers:
            self.buf = self._allocate(template)
            self._private = [k for k in self.buf.keys(True) if _is_private(k)]
        self._layout = self._make_layout()

    def _allocate(self, template: Any) -> Any:
        """A zeroed ``[*B, T]`` batch from one frame's ``template``, with the collector's columns."""
        if self._compact:
            template = template.exclude(*self._compact)
        buf = template.unsqueeze(-1).expand(*self.B, self.T).clone().zero_()
        dev = self.options.storing_device
        if dev is not None:
            buf = buf.to(dev)
        else:
            buf.clear_device_()
        columns = [_TRAJ, _VERSION, _WORKER] if self.options.track_traj_ids else [_VERSION, _WORKER]
        for key in columns:
            buf.set(key, torch.zeros(*self.B, self.T, dtype=torch.int64, device=dev))
        buf.refine_names(*([None] * self.nb), "time")
        return buf

    def _make_layout(self) -> BatchLayout:
        """Leaves of one (public) batch, or a layout marking batches that travel whole (pickled)."""
        out = self.buf.exclude(*self._private) if self.buf is not None else None
        shape = (*self.B, self.T)
        if out is None or not _dense(out):
            return BatchLayout([], shape=shape, pickled=True, hidden=self.hidden_keys)
        leaves = [(k, tuple(v.shape), v.dtype) for k, v in out.items(True, True)]
        return BatchLayout(leaves, shape=shape, nested=nested_batch_dims(out), hidden=self.hidden_keys)

    def output_layout(self) -> BatchLayout:
        """Keys, shapes and dtypes of the batches (with nested batch dims), once `prepare` ran."""
        if self._layout is None:
            self.prepare()
        assert self._layout is not None
        return self._layout

    # -- the loop --------------------------------------------------------------------------------
    def _run(self, random: bool, preempt: Callable[[], bool] | None) -> tuple[Any, int]:
        """One batch: (the stacked TensorDict, the steps taken)."""
        from tensordict import TensorDict
        from torchrl.envs.utils import set_exploration_type

        self.prepare()
        if self.needs_reset:
            self._reset()
        elif self.options.reset_at_each_iter:
            self._carrier.update(self.base.reset())
            if self.options.track_traj_ids:
                ids = self._carrier.get(_TRAJ)
                self._carrier.set(_TRAJ, self.counter.take(ids.numel()).reshape(ids.shape).to(ids.device))
        self.versions = []
        steps, tds = self.T, []
        base, pol, track, compact = self.base, self._pol, self.options.track_traj_ids, self._compact
        storing = self.options.storing_device
        no_device = self._no_device
        with torch.no_grad(), set_exploration_type(pol.exploration):
            for t in range(self.T):
                if t and preempt is not None and preempt():  # the first step is always taken (TorchRL's rule)
                    steps = t
                    break
                if self.stop.is_set():
                    raise Interrupted
                carrier = self._carrier
                if random:
                    self.versions.append(self.policy.version)
                    base.rand_action(carrier)
                else:
                    pol(carrier, self.versions)
                env_output, env_next = base.step_and_maybe_reset(pol.to_env(carrier))
                if env_output is not carrier:
                    next_data = env_output.get("next")
                    if no_device:  # one device (or none) for the whole carrier: steps stack alike
                        next_data.clear_device_()
                    carrier.set("next", next_data)
                rec = carrier.exclude(*compact) if compact else carrier
                tds.append(rec.to(storing, non_blocking=True) if storing is not None else rec)
                if track:
                    collector_data = carrier.get("collector").copy()
                if no_device:
                    env_next.clear_device_()
                self._carrier = env_next
                if track:
                    env_next.set("collector", collector_data)
                    self._new_trajectories(env_output)
                self.steps_done += 1
        if self.buf is not None:
            out = self.buf
            try:
                torch.stack(tds, self.nb, out=out[..., :steps] if steps < self.T else out)
            except RuntimeError:
                with out.unlock_():
                    torch.stack(tds, self.nb, out=out[..., :steps] if steps < self.T else out)
        else:
            out = TensorDict.maybe_dense_stack(tds, dim=self.nb)
            out.refine_names(*([None] * self.nb), "time")
        self._mark(out, steps)
        return out, steps

    def _mark(self, out: Any, steps: int) -> None:
        """Policy versions and worker ids per frame; truncation marks; preempted steps blanked."""
        shape = (*self.B, self.T) if steps == self.T or self.buf is not None else (*self.B, steps)
        versions = version_column(self.versions, shape[-1])
        out.set(_VERSION, versions.to(self.options.storing_device).expand(shape).clone())
        out.set(_WORKER, torch.full(shape, self.worker_id, dtype=torch.int64, device=self.options.storing_device))
        if steps < shape[-1]:  # a preempted batch: the missing steps are blank, with id -1 (TorchRL's mark)
            rest = out[..., steps:]
            rest.zero_()
            if self.options.track_traj_ids:
                rest.fill_(_TRAJ, -1)
            rest.fill_(_VERSION, -1)
        last = (slice(None),) * self.nb + (slice(steps - 1, steps),)
        for key in self._truncated_keys:
            trunc = out.get(("next", key))
            trunc[last] = True
            done_key = ("next", _with_last(key, "done"))
            out.set(done_key, out.get(done_key) | trunc)

    def fake_batch(self) -> Any:
        """A zero-filled batch with the keys, shapes and names `collect` gives (TorchRL's ``fake_tensordict``)."""
        self.prepare()
        if self.buf is not None:
            fake = self._public(self.buf).clone().zero_()
        else:  # batches are stacked as they come: the template shows what one holds
            fake = self._public(self._allocate(self._pol.setup(self._carrier)))
        self.versions = []
        self._mark(fake, self.T)
        return fake

    def weights_applied(self) -> None:
        """New weights were loaded: a ``PolicyVersion`` transform on the env moves on (TorchRL's rule)."""
        tracker = self.env.version_tracker
        if tracker is not None:
            tracker.increment_version()

    def drop_views(self) -> None:
        """`Rollout.drop_views`: nothing to free (this rollout keeps no per-step views; each batch stacks its steps)."""

    def _public(self, out: Any) -> Any:
        private = self._private or [k for k in out.keys(True) if _is_private(k)]
        return out.exclude(*private) if private else out

    def collect(self, random: bool, out: Any = None, preempt: Callable[[], bool] | None = None) -> Any:
        """Collect one batch (blocking) as a new ``[*B, T]`` TensorDict (the buffer itself is reused)."""
        batch, _ = self._run(random, preempt)
        batch = self._public(batch)
        return batch.clone() if self.buf is not None else batch

    def collect_same(self, random: bool) -> Any:
        """Collect one batch into the preallocated TensorDict and return it, not a copy (``return_same_td``)."""
        batch, _ = self._run(random, None)
        return self._public(batch)

    def collect_into(
        self, random: bool, out: dict[Any, torch.Tensor], preempt: Callable[[], bool] | None = None
    ) -> int:
        """Collect one batch and copy its leaves into ``out`` (a worker's slot, a replay buffer's rows)."""
        batch, steps = self._run(random, preempt)
        for key, value in self._public(batch).items(True, True):
            out[key].copy_(value)
        return steps


def _dense(td: Any) -> bool:
    """Whether ``td`` is plain TensorDicts of tensors all the way down (a fixed, shareable layout)."""
    from tensordict import TensorDict

    if type(td) is not TensorDict:
        return False
    for value in td.values():
        if isinstance(value, torch.Tensor):
            continue
        if not _dense(value):
            return False
    return True

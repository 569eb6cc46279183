"""The weights part of the multi-worker engine: updates, acknowledgements, per-worker weights and versions.

Every worker holds its own copy of the policy. An update reaches it one of two ways:

* the transport's shared weight store: the parent writes the state dict once and each worker
  copies it into its policy on `ApplyWeights`. Used when every worker gets the same weights
  and the parent knows their layout (it holds an ``nn.Module`` policy);
* the worker's command channel: `LoadWeights` carries a packed copy. Used for weights of one
  worker alone (``{worker: weights}``, ``worker_ids=``) and for workers whose policy exists
  only in them (``policy_factory`` without ``policy``). A large state dict then waits in the
  channel until the worker reads it, between batches.

Either way the worker answers `WeightsApplied`. The engine keeps the version each worker must
reach (``_targets``): liveness counts a missing acknowledgement as work owed, a restarted
worker starts from its version and weights, and `state_dict` reports each worker's version
and the weights it was last given. Right after sending, the engine raises the worker's
weights signal (``_workers._updates``) so the update overtakes the batches queued before it.

The call waits only for the workers that were idle: one in the middle of a batch loads the
update when that batch ends, which would hold the trainer back for up to a batch per update
(a `MultiAsyncCollector`'s workers are always collecting: measured, half its frames/s with an
update after every batch, and a single worker's with eight of them). A transport with
``versioned_weights`` also takes the next version while workers still load the last one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import torch

from .._collect._inplace import InPlaceWatch
from .._collect._weight_sync import NO_ROUTE, WeightSyncAPI, WeightUpdate
from .._core._errors import CollectorClosedError
from .._core._threads import to_thread
from .._workers._messages import ApplyWeights, LoadWeights
from .._workers._updates import weights_signal
from .._workers._weights import flat_state, pack_state, state_of, unpack_state, weights_layout
from ._config import MultiConfig

__all__ = ["EngineWeights"]


def _cpu_copy(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: torch.as_tensor(v).detach().to("cpu", copy=True) for k, v in state.items()}


class EngineWeights(WeightSyncAPI):
    """Mixed into `MultiCollectorBase` (not public); see the module docstring."""

    _mc: MultiConfig
    _transport: Any
    _pump: Any
    _policy: Any
    _num_workers: int
    _closed: bool
    _started: bool
    _rb: Any
    _worker_noun: str
    _outstanding: list[dict[int, Any]]
    _inplace_watch: Any
    _auto_push_arg = "update_at_each_batch"  # the argument that makes the collector send weights on its own

    def _mark_busy(self, w: int) -> None:
        raise NotImplementedError

    def _init_weights(self, mc: Any, policy: Any) -> None:
        n = mc.num_workers
        self._weight_sync = mc.weight_sync
        self._version = 0
        self._targets = [0] * n  # the version each worker must reach
        self._own_weights: list[bytes | None] = [None] * n  # packed weights a worker got alone (newest wins)
        self._shared_state: dict[str, Any] | None = None  # what the shared store (or the shipped policy) holds
        self._weights_layout = weights_layout(policy)
        self._published = False  # whether workers must start from the transport's weights
        self._unpublished: Any = None  # weights given before the transport existed
        self._update_lock: anyio.Lock | None = None
        self._watching = True  # no update sent yet: watch for a policy trained in place (see _collect._inplace)

    def _auto_weight_push(self) -> bool:
        """Whether the collector sends the policy's weights on its own (no update call needed)."""
        return bool(self._mc.update_at_each_batch)

    def _policy_held(self) -> str:
        """The policy the collector was given, for messages (``"no policy"``, ``"a Foo policy"``)."""
        return "no policy" if self._policy is None else f"a {type(self._policy).__name__} policy"

    def _weights_sent(self) -> None:
        """An update went out: the user syncs, nothing to watch for."""
        self._watching, self._inplace_watch = False, None

    def _weights_started(self) -> None:
        """The transport exists: publish what was given before, note what the shipped policy holds."""
        self._update_lock = anyio.Lock()
        if self._unpublished is not None:
            self._publish(self._unpublished)
        if self._shared_state is None and self._weights_layout is not None and not any(self._mc.factories):
            self._shared_state = _cpu_copy(state_of(self._weights_layout, self._policy))
        policy = self._policy
        if self._watching and self._weight_sync.enabled and isinstance(policy, torch.nn.Module):
            if not self._auto_weight_push():
                noun, owner = self._worker_noun, type(self).__name__
                fix = (
                    f" (or pass {self._auto_push_arg}=True to {owner}); aiocollect's {noun} hold copies, where "
                    "TorchRL's CPU workers read the live parameters"
                )
                self._inplace_watch = InPlaceWatch(owner, policy, self._shared_state, holder=f"its {noun}", fix=fix)

    def _publish(self, state: Any, version: int | None = None) -> None:
        """Make ``state`` the weights workers load (now, or as soon as the transport exists).

        ``version``: the policy version they are (default: the current one).
        """
        if self._transport is None:
            self._unpublished = {k: torch.as_tensor(v).detach().clone() for k, v in state.items()}
            return
        self._transport.publish_weights(state, self._version if version is None else version)
        self._unpublished, self._published = None, True

    def _policy_version(self) -> int:
        return self._version

    def _set_policy_version(self, version: int) -> None:
        self._version = version

    def _loaded_weights(self, state: dict[str, Any]) -> None:
        # Restarted workers start from them; running ones load them at the next update.
        self._weights_sent()  # the workers' weights now come from the state, not the policy
        if self._weights_layout is not None:
            self._publish(state_of(self._weights_layout, state))

    def _num_weight_targets(self) -> int:
        return self._num_workers

    def _default_scheme(self) -> str | None:
        # TorchRL's worker collectors sync a module policy through shared memory by default.
        return "SharedMemWeightSyncScheme" if isinstance(self._policy, torch.nn.Module) else None

    # -- updates ---------------------------------------------------------------------------------
    def _plan_update(self, update: WeightUpdate) -> tuple[dict[str, Any] | None, dict[int, bytes]]:
        """The state dict for the shared store, or the packed weights per worker (off the event loop)."""
        if update.per_worker is not None:
            return None, {w: pack_state(flat_state(src)) for w, src in update.per_worker.items()}
        source, layout = update.source, self._weights_layout
        if source is None and not isinstance(self._policy, torch.nn.Module):
            raise RuntimeError(
                f"{NO_ROUTE}: this {type(self).__name__} has {self._policy_held()}, not an nn.Module, to read "
                "weights from (a policy_factory builds its policy in the workers); pass them: "
                "update_policy_weights_(weights)"
            )
        workers = update.workers or tuple(range(self._num_workers))
        if layout is None and any(self._mc.factories[w] is None for w in workers):
            raise TypeError(
                f"explicit weights need an nn.Module policy in the workers, got {type(self._policy).__name__}; "
                "collect with an nn.Module policy (or build one with policy_factory)"
            )
        source = self._policy if source is None else source
        state = state_of(layout, source) if layout is not None else flat_state(source)
        if layout is not None and update.workers is None:
            return state, {}
        packed = pack_state(state)
        return None, dict.fromkeys(workers, packed)

    async def _send_update(self, update: WeightUpdate) -> None:
        if self._closed:
            raise CollectorClosedError(f"this {type(self).__name__} was shut down; create a new one")
        self._weights_sent()
        state, packed = await to_thread(self._plan_update, update)
        async with self._update_lock or anyio.Lock():
            started = self._started and self._pump is not None
            if state is not None:
                if started and self._version > 0 and not self._transport.versioned_weights:
                    # A worker still loading the last version from this store would get a torn
                    # mix of two, or newer weights under the older version's number.
                    await self._await_targets(range(self._num_workers))
                await to_thread(self._publish_shared, state, self._version + 1)
                workers = list(range(self._num_workers))
            else:
                workers = sorted(packed)
                for w in workers:
                    self._own_weights[w] = packed[w]
            self._version += 1
            for w in workers:
                self._targets[w] = self._version
            if self._rb is not None:
                self._rb.policy_version = self._version
            if not started:
                return  # workers start from them
            # A worker collecting a batch takes the update once that batch is done, which may be
            # a whole batch away: waiting for it would hold the trainer back that long at every
            # update (a MultiAsyncCollector's workers are always collecting). The call waits
            # for the idle workers, which load at once; the others load before their next batch.
            pump, idle = self._pump, []
            for w in workers:
                if pump.alive[w]:
                    if self._between_batches(w):
                        idle.append(w)
                    self._send_weights(w, shared=state is not None)
            if self._weight_sync.wait:
                await self._await_targets(idle)

    def _publish_shared(self, state: dict[str, Any], version: int) -> None:
        self._publish(state, version)
        self._shared_state = _cpu_copy(state)
        self._own_weights = [None] * self._num_workers  # every worker takes the shared weights now

    def _send_weights(self, w: int, *, shared: bool) -> None:
        version = self._targets[w]
        self._mark_busy(w)
        cmd = ApplyWeights(version) if shared else LoadWeights(version, self._own_weights[w])
        self._transport.send(w, cmd)
        if self._mc.preemptive_threshold is None:  # the preempt word is free: overtake the queued batches
            self._transport.preempt(w, weights_signal(version))

    def _between_batches(self, w: int) -> bool:
        """Whether worker ``w`` has no batch in progress (it would load weights at once)."""
        return len(self._outstanding[w]) <= len(self._pump.pending[w])

    async def _await_acks(self, version: int, *, send: bool = True) -> None:
        """Bring every live worker to ``version`` of the shared store (sending it if ``send``).

        Waits for the workers that were idle; the others load it before their next batch.
        """
        pump = self._pump
        live = [w for w in range(self._num_workers) if pump.alive[w]]
        behind = [w for w in live if pump.acked[w] < version]
        idle = [w for w in live if self._between_batches(w)]
        for w in live:
            self._targets[w] = max(self._targets[w], version)
        if send and behind:
            for w in live:
                self._mark_busy(w)
                self._transport.send(w, ApplyWeights(version))
        await self._await_targets(idle)

    async def _await_targets(self, workers: Any) -> None:
        """Wait until each live worker of ``workers`` acknowledged its target version."""
        pump = self._pump
        live = [w for w in workers if pump.alive[w]]

        def done() -> bool:
            return all(pump.acked[w] >= self._targets[w] or not pump.alive[w] for w in live)

        with anyio.move_on_after(self._mc.weight_sync_timeout):
            await pump.until(done)
            return
        late = [w for w in live if pump.acked[w] < self._targets[w] and pump.alive[w]]
        versions = sorted({self._targets[w] for w in late})
        which = f"policy version {versions[0]}" if len(versions) == 1 else f"policy versions {versions}"
        raise TimeoutError(
            f"{self._worker_noun} {late} did not apply {which} within weight_sync_timeout="
            f"{self._mc.weight_sync_timeout}s, though they were between batches; raise weight_sync_timeout "
            "if loading weights this large takes longer, else find what holds them up (their env or policy)"
        )

    # -- state -----------------------------------------------------------------------------------
    def _worker_states(self) -> dict[str, Any]:
        """TorchRL's per-worker entries of `state_dict`: each worker's version and the weights it was given."""
        out = {}
        for w in range(self._num_workers):
            own = self._own_weights[w]
            weights = unpack_state(own) if own is not None else self._shared_state
            out[f"worker{w}"] = {"policy_state_dict": weights, "policy_version": self._targets[w]}
        return out

    def _restore_workers(self, state_dict: Mapping[str, Any]) -> None:
        """Give each worker the version (and weights) its entry of ``state_dict`` saved."""
        pump = self._pump
        for w in range(self._num_workers):
            entry = state_dict.get(f"worker{w}")
            if not isinstance(entry, Mapping):
                continue
            version = int(entry.get("policy_version", self._version))
            weights = entry.get("policy_state_dict")
            payload = None if weights is None else pack_state(flat_state(weights))
            self._targets[w] = version
            if payload is not None:
                self._own_weights[w] = payload
            if self._started and pump is not None and pump.alive[w]:
                if self._mc.preemptive_threshold is None:
                    self._transport.preempt(w, 0)  # a signal of a newer version must not outlive the restore
                pump.acked[w] = min(pump.acked[w], version)
                self._mark_busy(w)
                self._transport.send(w, LoadWeights(version, payload, restore=True))

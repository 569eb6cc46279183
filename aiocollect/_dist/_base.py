"""The engine of every collector whose workers are collection nodes (torch.distributed, Ray, RPC).

Each node is one "worker" of the multi-worker engine, reached through a transport
(``_workers._distributed``, ``_workers._ray``, ``_workers._rpc``) and running a whole
collector (``_dist._node``). The engine's machinery (start-up, weights with per-node
acknowledgements, supervision, liveness, bounded shutdown, replay buffers) is used unchanged;
this module holds the three delivery policies: every node's share on demand (``sync=True``),
the first node's batch (``sync=False``), and one batch per free-running node
(`DistributedSyncCollector`), and TorchRL's weight-update knobs.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

import anyio
import cloudpickle
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from .._collect._weight_sync import WeightUpdate, WeightUpdates
from .._core._errors import CollectorClosedError
from .._core._public import fill_args
from .._core._ragged import frame_count
from .._core._threads import to_thread
from .._multi._engine import MultiCollectorBase
from .._rollout._policy import NO_ROUTE
from .._workers._messages import ApplyWeights
from .._workers._weights import flat_state, state_of
from ._config import resolve_dist_config
from ._node import NodeSpec

__all__ = ["COLLECTOR_ARGS_DOC", "NodeCollectorBase", "fill_args"]

#: The Args entries of the arguments every node collector takes from `Collector`, as they
#: apply to nodes; `fill_args` puts them in place of a class docstring's ``{args}`` line.
COLLECTOR_ARGS_DOC = """\
policy_factory: A zero-argument callable that builds the policy on each node instead of
    sending ``policy`` (or one per node). ``policy`` may still be given: it lays out the
    weights the nodes receive, and `update_policy_weights_()` reads them from it. Without
    it, the first weights passed to `update_policy_weights_` lay them out (TorchRL's lazy
    weight sync), before the nodes start or while they run.
device: Default for ``env_device``, ``policy_device`` and ``storing_device``.
storing_device: Device of the batches this process yields (moved there on arrival).
env_device: Device the nodes move actions to before stepping their envs (one, or one
    per node).
policy_device: Device the nodes' policy runs on (one, or one per node).
max_frames_per_traj: Nodes truncate (and reset) trajectories after this many steps;
    adds ``step_count``. ``None`` or ``<= 0`` disables it.
init_random_frames: Frames collected with random actions before the policy is used,
    split evenly across nodes.
reset_at_each_iter: Nodes reset every env at the start of every batch.
postproc: A callable applied to each batch in this process (after ``split_trajs``).
split_trajs: Split each batch into zero-padded trajectories (`split_trajectories`), in
    this process.
exploration_type: The ``tensordict.nn.InteractionType`` the nodes' policy runs under.
trajs_per_batch: Yield batches of this many complete trajectories (episodes ending at
    ``("next", "done")``) instead of ``frames_per_batch`` frames, assembled in this
    process from the nodes' batches (each episode from one env of one node, in completion
    order); with ``replay_buffer``, finished episodes are written as flat runs of frames.
    Given in ``collector_kwargs`` (TorchRL's way), it must be the same for every node.
traj_format: With ``trajs_per_batch``: ``"padded"`` (default; ``[N, max_len]`` with a
    ``("collector", "mask")``) or ``"cat"`` (the episodes' frames end to end).
trajs_per_write: With ``trajs_per_batch`` and ``replay_buffer``: episodes per ``extend``
    (default 1).
max_queued_batches: How many batches this process may gather ahead of the consumer.
num_threads: Torch threads of this process while the nodes run (default: the cores
    left after one per node).
reset_when_done: Must be True (kept for TorchRL compatibility).
set_truncated: Mark the last step of each node's batches as truncated (the env is not
    reset); passed on to every node.
track_traj_ids: Write ``("collector", "traj_ids")`` (unique across nodes); passed on to
    every node. ``split_trajs`` needs it True.
weight_sync_schemes: TorchRL's ``{"policy": scheme}``. The scheme of this kind of
    collector (``RayWeightSyncScheme`` for `RayCollector`, ``RPCWeightSyncScheme`` for
    `RPCCollector`, ``DistributedWeightSyncScheme`` for the torch.distributed ones) is
    honoured by aiocollect's node transport, as if none was given
    (``DistributedWeightSyncScheme(sync=False)``: `update_policy_weights_` does not wait for
    acknowledgements); ``NoWeightSyncScheme`` makes updates do nothing; any other scheme
    raises ``NotImplementedError``.
weight_updater: Not supported (``NotImplementedError``): TorchRL's ``WeightUpdaterBase``
    pushes through TorchRL's own node handles.
weight_recv_schemes: ``None`` only (``NotImplementedError`` otherwise): nodes take weights
    from this collector's `update_policy_weights_`, not from a parent process.
"""


class NodeCollectorBase(WeightUpdates, MultiCollectorBase):
    """The node engine: subclasses set the delivery policy and call `_init_nodes` from ``__init__``."""

    _gather: bool  # every node's share is gathered into one batch
    _asked: bool  # nodes collect only when asked (weights then go out before each batch)
    _worker_noun = "nodes"
    _auto_push_arg = "update_after_each_batch"
    _restart_arg = "restart_nodes"
    _native_scheme = "DistributedWeightSyncScheme"  # TorchRL's weight-sync scheme of this kind of collector

    def _init_nodes(
        self,
        create_env_fn: Any,
        policy: Any,
        *,
        transport: str,
        transport_options: dict[str, Any],
        replay_buffer: Any,
        restart_nodes: int,
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        node_options: dict[str, tuple[Any, Any]] | None = None,
        **common: Any,
    ) -> None:
        """Validate everything (before anything starts) and set up the engine.

        ``node_options``: ``{name: (value, default)}``, more arguments every node's collector
        gets (a subclass's own, such as `RayCollector`'s hooks).
        """
        traj = {"trajs_per_batch": trajs_per_batch, "traj_format": traj_format, "trajs_per_write": trajs_per_write}
        dc = self._dc = resolve_dist_config(
            type(self).__name__, create_env_fn=create_env_fn, policy=policy, transport=transport,
            transport_options=transport_options, gather=self._gather, on_demand=self._asked,
            restart_workers=restart_nodes, native_scheme=self._native_scheme, traj_args=traj,
            node_options=node_options, **common,
        )  # fmt: skip
        self._since_update = [0] * dc.mc.num_workers  # batches each node delivered since it was sent weights
        self._yielded = 0
        # Whole trajectories are assembled here, from the nodes' batches (`_WorkerTrajectories`
        # keeps each node's unfinished episodes apart by their worker ids).
        self._init_multi(dc.mc, policy, replay_buffer, **dc.traj_args)

    def _spec_bytes(self, w: int) -> bytes:
        dc, mc = self._dc, self._mc
        spec = NodeSpec(
            node=w, num_nodes=self._num_workers, collector_class=dc.collector_class,
            create_env_fn=mc.worker_cfgs[w].create_env_fn, workers_per_node=dc.workers_per_node,
            policy=None if mc.factories[w] is not None else self._policy, policy_factory=mc.factories[w],
            frames_per_batch=dc.node_fpb, kwargs=dc.node_kwargs[w], seed=self._worker_seeds[w],
            policy_version=self._version, load_weights=self._published, generation=self._generation[w],
        )  # fmt: skip
        try:
            return cloudpickle.dumps(spec)
        except Exception as exc:
            raise TypeError(
                f"the env factory or policy for node {w} cannot be pickled for the node ({exc}); pass module-level "
                "functions, lambdas or functools.partial objects"
            ) from exc

    # -- what nodes do not do ----------------------------------------------------------------
    # A node runs a whole collector of its own, which answers no remote calls and runs no hooks
    # sent from here: the worker-process collectors' requests would fail the node.
    def _unsupported(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} does not support {what}: its nodes run whole collectors that do not take requests "
            "from the trainer; use MultiSyncCollector or MultiAsyncCollector (worker processes), or compute it in "
            "postproc"
        )

    def _prepare_hook(self, name: str, hook: Any) -> bytes:
        raise self._unsupported(name)

    def _check_profiled_workers(self, config: Any) -> None:
        raise self._unsupported("enable_profile()")

    async def _ask(self, what: str, requests: list[Any]) -> list[Any]:
        raise self._unsupported(what)

    # -- weights -----------------------------------------------------------------------------
    async def _send_update(self, update: WeightUpdate) -> None:
        """Publish one set of weights and send it to the live nodes the update names.

        Waits for the nodes between batches to apply it (unless the scheme says ``sync=False``);
        a node in the middle of a batch applies it before its next one.
        """
        if self._closed:
            raise CollectorClosedError(f"this {type(self).__name__} was shut down; create a new one")
        if update.per_worker is not None:
            raise ValueError(
                f"{type(self).__name__} sends one set of weights per update, got weights for nodes "
                f"{sorted(update.per_worker)}: call update_policy_weights_(weights, worker_ids=node) for each"
            )
        source = update.source
        layout = self._weights_layout or self._adopt_layout(source)
        self._weights_sent()
        state = state_of(layout, self._policy if source is None else source)
        nodes = list(range(self._num_workers)) if update.workers is None else list(update.workers)
        async with self._update_lock or anyio.Lock():
            # Each version is its own buffer in the transport: no node can read a torn mix of
            # two, so there is no need to wait for the previous update first.
            await to_thread(self._publish, state, self._version + 1)
            self._version += 1
            if self._rb is not None:
                self._rb.policy_version = self._version
            for w in nodes:
                self._since_update[w] = 0
            if self._started and self._pump is not None:
                await self._send_to_nodes(nodes, self._version, wait=self._weight_sync.wait)

    async def _send_to_nodes(self, nodes: list[int], version: int, *, wait: bool) -> None:
        """Send ``version`` to the live ``nodes`` behind it; with ``wait``, wait for those between batches."""
        pump = self._pump
        assert pump is not None
        live = [w for w in nodes if pump.alive[w]]
        idle = [w for w in live if self._between_batches(w)]
        for w in live:
            self._targets[w] = max(self._targets[w], version)
            if pump.acked[w] < version:
                self._mark_busy(w)
                self._transport.send(w, ApplyWeights(version))  # type: ignore[union-attr]
        if wait:
            await self._await_targets(idle)

    def _default_scheme(self) -> str | None:
        return self._native_scheme  # TorchRL's node collectors default to their own scheme, whatever the policy

    def _adopt_layout(self, source: Any) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """Lay the nodes' weights out from the first explicit weights (nodes build their policy).

        TorchRL's lazy weight sync: with ``policy_factory`` and no ``policy=`` module, the first
        update's weights say what every later one holds. Nodes that already run are told the
        layout before these weights reach them.
        """
        if source is None or not any(f is not None for f in self._mc.factories):
            self._no_weights_layout(source)
        state = flat_state(source)
        layout = [(k, tuple(v.shape), v.dtype) for k, v in ((k, torch.as_tensor(v)) for k, v in state.items())]
        self._weights_layout = layout
        if self._transport is not None:
            self._transport.adopt_weights_layout(layout)
        return layout

    def _no_weights_layout(self, source: Any) -> NoReturn:
        held, name = self._policy_held(), type(self).__name__
        if source is None:
            fix = (
                "pass the weights, update_policy_weights_(weights) (the nodes build their policy with policy_factory)"
                if any(f is not None for f in self._mc.factories)
                else f"pass an nn.Module as policy= to {name}"
            )
            raise RuntimeError(f"{NO_ROUTE}: this {name} has {held}, not an nn.Module, to read weights from; {fix}")
        raise TypeError(
            f"explicit weights need an nn.Module on the nodes to load them into, and this {name} has {held} and no "
            "policy_factory; pass an nn.Module as policy= (or build one on each node with policy_factory)"
        )

    async def _push_weights(self, nodes: list[int]) -> None:
        """Send the policy's current weights to ``nodes`` without waiting for them."""
        layout = self._weights_layout
        if layout is None or not isinstance(self._policy, torch.nn.Module) or self._pump is None:
            return  # nothing here to read weights from (a policy_factory's live on the nodes)
        if not self._weight_sync.enabled:
            return  # NoWeightSyncScheme
        self._weights_sent()
        await to_thread(self._publish, state_of(layout, self._policy))
        self._version += 1
        if self._rb is not None:
            self._rb.policy_version = self._version
        for w in nodes:
            if self._pump.alive[w]:
                self._transport.send(w, ApplyWeights(self._version))  # type: ignore[union-attr]
                self._since_update[w] = 0

    def _auto_weight_push(self) -> bool:
        dc = self._dc
        return bool(self._mc.update_at_each_batch or dc.update_after_each_batch or dc.max_weight_update_interval > -1)

    async def _after_batch(self, delivered: list[int]) -> None:
        """Weight rules after a batch: per node (TorchRL's knobs), then every ``update_interval`` batches."""
        dc = self._dc
        self._yielded += 1
        for w in delivered:
            self._since_update[w] += 1
        due: list[int] = []
        if dc.update_after_each_batch and not self._mc.update_at_each_batch:
            due = delivered  # async: the node that delivered gets the newest weights
        elif dc.max_weight_update_interval > -1:
            due = [w for w in delivered if self._since_update[w] > dc.max_weight_update_interval]
        if dc.update_interval is not None and self._yielded % dc.update_interval == 0:
            due = list(range(self._num_workers))
        if due:
            await self._push_weights(due)

    # -- delivery ----------------------------------------------------------------------------
    # A node's batch never goes straight into a replay buffer (the transports' memory is
    # "none"), nor is a node preempted: each policy below is the multi-worker one without those.
    _next_worker = 0

    def _dispatch_idle_nowait(self) -> None:
        """Ask every live node to collect into each of its free slots (free-running nodes)."""
        assert self._pump is not None
        for w in range(self._num_workers):
            if self._pump.alive[w]:
                for slot in list(self._idle[w]):
                    if not self._dispatch_nowait(w, slot):
                        return  # paused: try again after the next batch

    async def _take_one(self, w: int) -> TensorDictBase:
        slot, view = self._take(w)
        batch = await to_thread(view.clone)
        batch.refine_names(*([None] * (batch.ndim - 1)), "time")
        self._release_slot(w, slot, commit=False)
        return batch

    async def _take_every_node(self) -> TensorDictBase:
        """Wait for a batch of every node and stack them in node order: ``[nodes, *node_batch]``."""
        assert self._pump is not None
        pump, n = self._pump, self._num_workers
        await pump.until(lambda: all(pump.pending[w] for w in range(n)))
        taken = [self._take(w) for w in range(n)]
        batch = await to_thread(_stack, [view for _, view in taken])
        for w, (slot, _) in enumerate(taken):
            self._release_slot(w, slot, commit=False)
        return batch

    async def _first_node(self) -> TensorDictBase | None:
        """The batch of whichever node delivers first (nodes collect ahead, two slots each)."""
        await self._ensure_started()
        assert self._pump is not None
        pump, n = self._pump, self._num_workers
        start = time.perf_counter()
        self._dispatch_idle_nowait()
        if self._in_flight() == 0:
            return None  # paused: nothing was asked of any node
        await pump.until(lambda: any(pump.pending))
        order = [(self._next_worker + i) % n for i in range(n)]  # round robin: no node starves
        w = next(i for i in order if pump.pending[i])
        self._next_worker = (w + 1) % n
        batch = await self._take_one(w)
        await self._after_batch([w])
        self._dispatch_idle_nowait()
        return await self._deliver(batch, frame_count(batch), start, post=self._post_in_parent)

    async def _every_node(self) -> TensorDictBase | None:
        """One batch from every node (free-running nodes), stacked in node order."""
        await self._ensure_started()
        start = time.perf_counter()
        self._dispatch_idle_nowait()
        batch = await self._take_every_node()
        await self._after_batch(list(range(self._num_workers)))
        self._dispatch_idle_nowait()
        return await self._deliver_gathered(batch, start)

    async def _on_demand(self) -> TensorDictBase | None:
        """Every node's share, collected after any weight update (TorchRL's sync mode)."""
        await self._ensure_started()
        if self._mc.update_at_each_batch:
            await self.update_policy_weights_()
        start = time.perf_counter()
        for w in range(self._num_workers):
            self._send_collect(w, self._idle[w][0], None)
        batch = await self._take_every_node()
        delivered = await self._deliver_gathered(batch, start)
        await self._after_batch(list(range(self._num_workers)))
        return delivered

    async def _deliver_gathered(self, batch: TensorDictBase, start: float) -> TensorDictBase | None:
        """Deliver a ``[nodes, ...]`` batch; a TorchRL buffer gets each worker's batch as its own write.

        TorchRL's nodes extend the buffer with their own batches, and a node running several
        workers with each worker's: so does this, node by node, in order.
        """
        if self._torchrl_rb is None:
            return await self._deliver(batch, frame_count(batch), start, post=self._post_in_parent)
        multi = self._dc.collector_class.__name__ != "Collector"
        parts = [w for node in batch.unbind(0) for w in (node.unbind(0) if multi else (node,))]
        await self._deliver_parts(parts, frame_count(batch), start, post=self._post_in_parent)
        return None


def _stack(parts: list[TensorDictBase]) -> TensorDictBase:
    """The nodes' batches stacked along a new first dim (a copy: their slots are free after it)."""
    if any(p.shape != parts[0].shape for p in parts):
        return LazyStackedTensorDict.lazy_stack([p.clone() for p in parts], 0)
    out: TensorDictBase = torch.stack(parts, 0)  # a TensorDict (tensordict's __torch_function__)
    out.refine_names(*([None] * parts[0].ndim), "time")
    return out

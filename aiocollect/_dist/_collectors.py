"""DistributedCollector and DistributedSyncCollector: collection nodes over torch.distributed.

Each node is one "worker" of the multi-worker engine, reached through the distributed
transport (``_workers._distributed``) and running a whole collector (``_dist._node``). The
engine's machinery (start-up, weights with per-node acknowledgements, supervision, liveness,
bounded shutdown, replay buffers) is used unchanged; this module holds the constructors and
the three delivery policies: every node's share on demand (``sync=True``), the first node's
batch (``sync=False``), and one batch per free-running node (`DistributedSyncCollector`).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import cloudpickle
from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._core._errors import CollectorClosedError
from .._core._threads import to_thread
from .._multi._collectors import MultiAsyncCollector, MultiSyncCollector
from .._multi._engine import MultiCollectorBase
from .._workers._messages import ApplyWeights
from .._workers._weights import state_of
from ._config import resolve_dist_config
from ._node import NodeSpec

__all__ = ["DistributedCollector", "DistributedSyncCollector"]


class _DistributedBase(MultiCollectorBase):
    _gather: bool  # every node's share is gathered into one batch
    _asked: bool  # nodes collect only when asked (weights then go out before each batch)
    _worker_noun = "nodes"
    _restart_arg = "restart_nodes"

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        num_nodes: int | None = None,
        policy_factory: Any = None,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool | None = None,
        exploration_type: Any = InteractionType.RANDOM,
        collector_class: Any = "single",
        collector_kwargs: Any = None,
        num_workers_per_collector: int = 1,
        slurm_kwargs: dict[str, Any] | None = None,
        submitit_folder: str = "aiocollect_submitit",
        backend: str = "gloo",
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        update_interval: int | None = None,
        launcher: str = "submitit",
        tcp_port: int | None = None,
        master_addr: str | None = None,
        node_hosts: list[str] | None = None,
        start_method: str | None = None,
        join_timeout: float = 300.0,
        replay_buffer: Any = None,
        restart_nodes: int = 0,
        weight_sync_timeout: float = 60.0,
        worker_timeout: float | None = 300.0,
        shutdown_timeout: float = 10.0,
        max_queued_batches: int = 0,
        num_threads: int | None = None,
        reset_when_done: bool = True,
        set_truncated: bool = False,
        track_traj_ids: bool = True,
    ) -> None:
        transport = {
            "backend": backend, "launcher": launcher, "tcp_port": tcp_port, "master_addr": master_addr,
            "node_hosts": node_hosts, "slurm_kwargs": slurm_kwargs, "start_method": start_method,
            "join_timeout": join_timeout, "submitit_folder": submitit_folder,
        }  # fmt: skip
        dc = self._dc = resolve_dist_config(
            type(self).__name__, create_env_fn=create_env_fn, num_nodes=num_nodes, frames_per_batch=frames_per_batch,
            collector_class=collector_class, collector_kwargs=collector_kwargs,
            num_workers_per_collector=num_workers_per_collector, update_after_each_batch=update_after_each_batch,
            max_weight_update_interval=max_weight_update_interval, update_interval=update_interval,
            init_random_frames=init_random_frames, max_frames_per_traj=max_frames_per_traj,
            reset_at_each_iter=reset_at_each_iter, exploration_type=exploration_type, transport_options=transport,
            gather=self._gather, on_demand=self._asked, policy=policy, policy_factory=policy_factory,
            num_threads=num_threads,
            restart_workers=restart_nodes, weight_sync_timeout=weight_sync_timeout, worker_timeout=worker_timeout,
            device=device, env_device=env_device, policy_device=policy_device, storing_device=storing_device,
            postproc=postproc, split_trajs=split_trajs, total_frames=total_frames, max_queued_batches=max_queued_batches,
            reset_when_done=reset_when_done, set_truncated=set_truncated, track_traj_ids=track_traj_ids,
            shutdown_timeout=shutdown_timeout,
        )  # fmt: skip
        self._since_update = [0] * dc.mc.num_workers  # batches each node delivered since it was sent weights
        self._yielded = 0
        self._init_multi(dc.mc, policy, replay_buffer)

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

    @property
    def tcp_port(self) -> int | None:
        """The port nodes reach the trainer's TCPStore at (``MASTER_PORT``); ``None`` before start."""
        t = self._transport
        return None if t is None else t.store_port  # type: ignore[attr-defined]

    # -- weights -----------------------------------------------------------------------------
    async def update_policy_weights_(self, policy_or_weights: Any = None, *, weights: Any = None) -> None:
        """Send new weights to every live node and wait until each one applied them.

        Each node applies them between batches, so no batch mixes two versions, and records
        the version it collected with in ``("collector", "policy_version")``.

        Args:
            policy_or_weights: An ``nn.Module``, a state dict or a TensorDict of weights;
                ``None`` reads the ``policy`` passed to the constructor.
            weights: Same as ``policy_or_weights`` (TorchRL's keyword).

        Raises:
            TypeError: The collector has no ``nn.Module`` policy to take the weight layout from.
            TimeoutError: Some nodes did not acknowledge within ``weight_sync_timeout`` (the
                message names them).
        """
        if self._closed:
            raise CollectorClosedError(f"this {type(self).__name__} was shut down; create a new one")
        if self._weights_layout is None:
            raise TypeError(
                "update_policy_weights_() needs an nn.Module policy= to define the weights; pass policy= "
                "(it may be given together with policy_factory)"
            )
        source = self._weights_argument(policy_or_weights, weights)
        state = state_of(self._weights_layout, self._policy if source is None else source)
        async with self._update_lock or anyio.Lock():
            # Each version is its own buffer in the transport: no node can read a torn mix of
            # two, so there is no need to wait for the previous update first.
            await to_thread(self._publish, state)
            self._version += 1
            if self._rb is not None:
                self._rb.policy_version = self._version
            self._since_update = [0] * self._num_workers
            if self._started and self._pump is not None:
                await self._await_acks(self._version)

    async def _push_weights(self, nodes: list[int]) -> None:
        """Send the policy's current weights to ``nodes`` without waiting for them."""
        if self._weights_layout is None or self._pump is None:
            return
        await to_thread(self._publish, state_of(self._weights_layout, self._policy))
        self._version += 1
        if self._rb is not None:
            self._rb.policy_version = self._version
        for w in nodes:
            if self._pump.alive[w]:
                self._transport.send(w, ApplyWeights(self._version))  # type: ignore[union-attr]
                self._since_update[w] = 0

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
    _assemble = MultiSyncCollector._assemble
    _dispatch_idle_nowait = MultiAsyncCollector._dispatch_idle_nowait
    _next_worker = 0

    async def _take_one(self, w: int) -> TensorDictBase:
        slot, view = self._take(w)
        batch = await to_thread(view.clone)
        batch.refine_names(*([None] * (batch.ndim - 1)), "time")
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
        return await self._deliver(batch, batch.numel(), start, post=self._post_in_parent)

    async def _every_node(self) -> TensorDictBase | None:
        """One batch from every node (free-running nodes), stacked in node order."""
        await self._ensure_started()
        assert self._pump is not None
        pump, n = self._pump, self._num_workers
        start = time.perf_counter()
        self._dispatch_idle_nowait()
        await pump.until(lambda: all(pump.pending[w] for w in range(n)))
        taken = [self._take(w) for w in range(n)]
        batch = await to_thread(self._assemble, [view for _, view in taken])
        for w, (slot, _) in enumerate(taken):
            self._release_slot(w, slot, commit=False)
        await self._after_batch(list(range(n)))
        self._dispatch_idle_nowait()
        return await self._deliver(batch, batch.numel(), start, post=self._post_in_parent)

    async def _on_demand(self) -> TensorDictBase | None:
        """Every node's share, collected after any weight update (TorchRL's sync mode)."""
        batch = await MultiSyncCollector._collect_one(self)  # type: ignore[arg-type]
        await self._after_batch(list(range(self._num_workers)))
        return batch  # type: ignore[no-any-return]


_ARGS_DOC = """
    Args:
        create_env_fn: One env factory per node (a list), or one factory with ``num_nodes``;
            anything `Collector` accepts, picklable (lambdas are fine).
        policy: ``None``, an ``nn.Module`` or a TensorDict callable, sent to every node. An
            ``nn.Module`` also defines the weights `update_policy_weights_` sends.
        frames_per_batch: Frames per yielded batch. Where every node's share is gathered,
            it must split evenly across nodes (each collects ``frames_per_batch / nodes``).
        total_frames: Frames to collect in all; ``-1`` collects until you stop.
        num_nodes: Collection nodes, when ``create_env_fn`` is a single factory.
        collector_class: What each node runs: `Collector` (``"single"``, default),
            `MultiSyncCollector` (``"sync"``) or `MultiAsyncCollector` (``"async"``).
        collector_kwargs: More arguments of the nodes' collectors (a dict, or one per node).
        num_workers_per_collector: Worker processes of each node's multi collector.
        backend: ``"gloo"`` (CPU tensors, default), ``"nccl"`` (GPU tensors) or ``"mpi"``.
        launcher: Who starts nodes: ``"submitit"`` (default: SLURM jobs, or submitit's
            local executor without SLURM), ``"mp"`` (local processes) or ``"external"``
            (you run ``python -m aiocollect.node`` with ``MASTER_ADDR``, ``MASTER_PORT``
            and ``RANK`` on each machine).
        tcp_port: The trainer's TCPStore port, ``MASTER_PORT`` for nodes (default: any free
            port; ``MASTER_PORT`` from the environment with ``launcher="external"``).
        master_addr: The address nodes reach the trainer at (default: ``MASTER_ADDR``, else
            127.0.0.1 for ``"mp"`` and this host's address otherwise).
        node_hosts: With ``"mp"``/``"submitit"``: the local address each node connects from.
        slurm_kwargs: submitit parameters, over TorchRL's defaults (10 min, partition
            ``train``, 32 CPUs, no GPU).
        submitit_folder: Where submitit keeps its job files and node logs.
        update_after_each_batch: Send new weights with every batch: to every node before
            it is collected (``sync=True``), to the node that delivered it (``sync=False``),
            or to every node once it is gathered (`DistributedSyncCollector`).
        max_weight_update_interval: Send weights to a node once it delivered more than this
            many batches without an update (``-1``: never).
        update_interval: Send weights to every node every this many batches (``None``: never).
        replay_buffer: A `ReplayBuffer` the trainer extends with each batch (iteration
            yields ``None`` per batch).
        restart_nodes: How many crashed nodes to start again (re-seeded, re-synced) before a
            crash is raised (launchers ``"mp"`` and ``"submitit"``; external nodes rejoin).
        weight_sync_timeout: Seconds `update_policy_weights_` waits for acknowledgements.
        worker_timeout: Seconds a busy node may go without progress before `WorkerTimeoutError`.
        join_timeout: Seconds a node may take to join and get ready (build its collector and
            collect its first batch, which gives the trainer the batch layout).
        shutdown_timeout: Seconds each node gets to exit before it is killed.
        **others: ``policy_factory``, devices, ``max_frames_per_traj``, ``init_random_frames``
            (split across nodes), ``reset_at_each_iter``, ``postproc``, ``split_trajs``,
            ``exploration_type`` and the rest have `Collector`'s meaning.
"""


class DistributedCollector(_DistributedBase):
    """Collect on nodes that may run on other machines, through torch.distributed.

    A trainer (this process) and N collection nodes, each running an aiocollect collector.
    With ``sync=True`` each batch gathers every node's share, collected on demand after any
    weight update (shape ``[nodes, *node_batch]``); with ``sync=False`` (default) nodes
    collect ahead and each batch is the first node's to arrive. Batches carry the node and
    worker in ``("collector", "worker_id")`` (``node * workers_per_node + local worker``),
    trajectory ids unique across nodes, and the policy version they were collected with.
    {args}
    Examples:
        >>> import anyio
        >>> from aiocollect import DistributedCollector
        >>> async def main():
        ...     async with DistributedCollector(["CartPole-v1"] * 2, frames_per_batch=64, total_frames=128,
        ...                                     launcher="mp", sync=True) as c:
        ...         return [b.shape async for b in c]
        >>> if __name__ == "__main__":  # nodes re-import the main module
        ...     anyio.run(main)  # doctest: +SKIP
        [torch.Size([2, 32]), torch.Size([2, 32])]
    """

    def __init__(self, create_env_fn: Any, policy: Any = None, *, sync: bool = False, **kwargs: Any) -> None:
        from .._core._validate import check_bool

        check_bool("sync", sync)
        self._gather = self._asked = sync
        super().__init__(create_env_fn, policy, **kwargs)

    async def _collect_one(self) -> TensorDictBase | None:
        return await (self._on_demand() if self._gather else self._first_node())


class DistributedSyncCollector(_DistributedBase):
    """Free-running collection nodes; each batch stacks one batch from every node.

    Nodes never wait for the trainer: each keeps collecting (two batches ahead) and the
    trainer gathers the oldest batch of every node per iteration. The policy's weights go to
    every node each ``update_interval`` batches (default 1) without waiting; call
    `update_policy_weights_` to wait for acknowledgements. ``frames_per_batch`` is split
    evenly across nodes. Unlike TorchRL's, ``total_frames`` need not divide by the number of
    nodes (``-1`` works), and `set_seed`, `state_dict` and `update_policy_weights_` work.
    {args}
    Examples:
        >>> import anyio
        >>> from aiocollect import DistributedSyncCollector
        >>> async def main():
        ...     async with DistributedSyncCollector(["CartPole-v1"] * 2, frames_per_batch=64,
        ...                                         total_frames=128, launcher="mp") as c:
        ...         return [b.shape async for b in c]
        >>> if __name__ == "__main__":
        ...     anyio.run(main)  # doctest: +SKIP
        [torch.Size([2, 32]), torch.Size([2, 32])]
    """

    _gather = True
    _asked = False

    def __init__(
        self, create_env_fn: Any, policy: Any = None, *, update_interval: int | None = 1, **kwargs: Any
    ) -> None:
        super().__init__(create_env_fn, policy, update_interval=update_interval, **kwargs)

    async def _collect_one(self) -> TensorDictBase | None:
        return await self._every_node()


for _cls in (DistributedCollector, DistributedSyncCollector):
    _cls.__doc__ = (_cls.__doc__ or "").replace("{args}", _ARGS_DOC)

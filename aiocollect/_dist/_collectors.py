"""DistributedCollector and DistributedSyncCollector: collection nodes over torch.distributed.

Each node is one "worker" of the node engine (``_dist._base``), reached through the
distributed transport (``_workers._distributed``): a TCPStore and a control connection per
node for records, a private gloo (or NCCL) pair group per node for tensors.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._core._validate import check_bool
from ._base import COLLECTOR_ARGS_DOC, NodeCollectorBase, fill_args

__all__ = ["DistributedCollector", "DistributedSyncCollector"]


_TRANSPORT_ARGS = (
    "backend", "launcher", "tcp_port", "master_addr", "node_hosts", "slurm_kwargs", "start_method", "join_timeout",
    "submitit_folder", "ray_init_config", "remote_configs",
)  # fmt: skip


class _DistributedBase(NodeCollectorBase):
    def _init_distributed(self, create_env_fn: Any, policy: Any, **kwargs: Any) -> None:
        """Set up the nodes from every other argument of the constructor, passed by name."""
        transport = {k: kwargs.pop(k) for k in _TRANSPORT_ARGS}
        self._init_nodes(create_env_fn, policy, transport="distributed", transport_options=transport, **kwargs)

    @property
    def tcp_port(self) -> int | None:
        """The port nodes reach the trainer's TCPStore at (``MASTER_PORT``); ``None`` before start."""
        t = self._transport
        return None if t is None else t.store_port  # type: ignore[attr-defined]


# The Args entries of both collectors (``sync`` is DistributedCollector's only).
_FIRST_ARGS = """\
create_env_fn: One env factory per node (a list), or one factory with ``num_nodes``;
    anything `Collector` accepts, picklable (lambdas are fine).
policy: ``None``, an ``nn.Module`` or a TensorDict callable, sent to every node. An
    ``nn.Module`` also defines the weights `update_policy_weights_` sends.
frames_per_batch: Frames per yielded batch. Where every node's share is gathered,
    it must split evenly across nodes (each collects ``frames_per_batch / nodes``).
total_frames: Frames to collect in all; ``-1`` collects until you stop.
num_nodes: Collection nodes, when ``create_env_fn`` is a single factory.
"""
_SYNC_ARG = """\
sync: ``True``: each batch gathers every node's share, collected on demand after any
    weight update; ``False``: nodes collect ahead and each batch is the first node's.
"""
_NODE_ARGS = """\
collector_class: What each node runs: `Collector` (``"single"``, default),
    `MultiSyncCollector` (``"sync"``) or `MultiAsyncCollector` (``"async"``).
collector_kwargs: More arguments of the nodes' collectors (a dict, or one per node).
num_workers_per_collector: Worker processes of each node's multi collector.
backend: ``"gloo"`` (CPU tensors, default), ``"nccl"`` (GPU tensors) or ``"mpi"``.
launcher: Who starts nodes: ``"submitit"`` (default: SLURM jobs, or submitit's
    local executor without SLURM), ``"mp"`` (local processes), ``"ray"`` (Ray tasks
    on a cluster, or on a local Ray started for the collector), ``"external"``
    (you run ``python -m aiocollect.node`` with ``MASTER_ADDR``, ``MASTER_PORT``
    and ``RANK`` on each machine) or ``"submitit_delayed"`` (the node jobs that
    `submitit_delayed_launcher` submitted around the main function).
tcp_port: The trainer's TCPStore port, ``MASTER_PORT`` for nodes (default: any free
    port; ``MASTER_PORT`` from the environment with ``launcher="external"``).
master_addr: The address nodes reach the trainer at (default: ``MASTER_ADDR``, else
    127.0.0.1 for ``"mp"`` and a local Ray, this host's address otherwise).
node_hosts: With ``"mp"``/``"submitit"``: the local address each node connects from.
start_method: With ``launcher="mp"``: ``"forkserver"`` (default on Linux) or ``"spawn"``.
slurm_kwargs: submitit parameters, over TorchRL's defaults (10 min, partition
    ``train``, 32 CPUs, no GPU).
submitit_folder: Where submitit keeps its job files and node logs.
ray_init_config: With ``launcher="ray"``: `ray.init` arguments (``address`` to join a
    cluster; without one a local Ray is started, and shut down at close).
remote_configs: With ``launcher="ray"``: Ray task options of the nodes (resources:
    ``num_cpus``, ``num_gpus``, ``resources``...), one dict for all or one per node;
    default ``{"num_cpus": 1}``.
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
"""


class DistributedCollector(_DistributedBase):
    """Collect on nodes that may run on other machines, through torch.distributed.

    A trainer (this process) and N collection nodes, each running an aiocollect collector.
    With ``sync=True`` each batch gathers every node's share, collected on demand after any
    weight update (shape ``[nodes, *node_batch]``); with ``sync=False`` (default) nodes
    collect ahead and each batch is the first node's to arrive. Batches carry the node and
    worker in ``("collector", "worker_id")`` (``node * workers_per_node + local worker``),
    trajectory ids unique across nodes, and the policy version they were collected with.

    Args:
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

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        num_nodes: int | None = None,
        sync: bool = False,
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
        ray_init_config: dict[str, Any] | None = None,
        remote_configs: dict[str, Any] | list[dict[str, Any]] | None = None,
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
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        weight_sync_schemes: dict[str, Any] | None = None,
        weight_updater: Any = None,
        weight_recv_schemes: dict[str, Any] | None = None,
    ) -> None:
        check_bool("sync", sync)
        self._gather = self._asked = sync
        self._init_distributed(
            create_env_fn, policy, frames_per_batch=frames_per_batch, total_frames=total_frames, num_nodes=num_nodes,
            policy_factory=policy_factory, device=device, storing_device=storing_device, env_device=env_device,
            policy_device=policy_device, max_frames_per_traj=max_frames_per_traj,
            init_random_frames=init_random_frames, reset_at_each_iter=reset_at_each_iter, postproc=postproc,
            split_trajs=split_trajs, exploration_type=exploration_type, collector_class=collector_class,
            collector_kwargs=collector_kwargs, num_workers_per_collector=num_workers_per_collector,
            slurm_kwargs=slurm_kwargs, submitit_folder=submitit_folder, backend=backend,
            update_after_each_batch=update_after_each_batch, max_weight_update_interval=max_weight_update_interval,
            update_interval=update_interval, launcher=launcher, tcp_port=tcp_port, master_addr=master_addr,
            node_hosts=node_hosts, start_method=start_method, join_timeout=join_timeout,
            ray_init_config=ray_init_config, remote_configs=remote_configs, replay_buffer=replay_buffer,
            restart_nodes=restart_nodes, weight_sync_timeout=weight_sync_timeout, worker_timeout=worker_timeout,
            shutdown_timeout=shutdown_timeout, max_queued_batches=max_queued_batches, num_threads=num_threads,
            reset_when_done=reset_when_done, set_truncated=set_truncated, track_traj_ids=track_traj_ids,
            trajs_per_batch=trajs_per_batch, traj_format=traj_format, trajs_per_write=trajs_per_write,
            weight_sync_schemes=weight_sync_schemes, weight_updater=weight_updater,
            weight_recv_schemes=weight_recv_schemes,
        )  # fmt: skip

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

    Args:
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
        update_interval: int | None = 1,
        launcher: str = "submitit",
        tcp_port: int | None = None,
        master_addr: str | None = None,
        node_hosts: list[str] | None = None,
        start_method: str | None = None,
        join_timeout: float = 300.0,
        ray_init_config: dict[str, Any] | None = None,
        remote_configs: dict[str, Any] | list[dict[str, Any]] | None = None,
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
        trajs_per_batch: int | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        weight_sync_schemes: dict[str, Any] | None = None,
        weight_updater: Any = None,
        weight_recv_schemes: dict[str, Any] | None = None,
    ) -> None:
        self._init_distributed(
            create_env_fn, policy, frames_per_batch=frames_per_batch, total_frames=total_frames, num_nodes=num_nodes,
            policy_factory=policy_factory, device=device, storing_device=storing_device, env_device=env_device,
            policy_device=policy_device, max_frames_per_traj=max_frames_per_traj,
            init_random_frames=init_random_frames, reset_at_each_iter=reset_at_each_iter, postproc=postproc,
            split_trajs=split_trajs, exploration_type=exploration_type, collector_class=collector_class,
            collector_kwargs=collector_kwargs, num_workers_per_collector=num_workers_per_collector,
            slurm_kwargs=slurm_kwargs, submitit_folder=submitit_folder, backend=backend,
            update_after_each_batch=update_after_each_batch, max_weight_update_interval=max_weight_update_interval,
            update_interval=update_interval, launcher=launcher, tcp_port=tcp_port, master_addr=master_addr,
            node_hosts=node_hosts, start_method=start_method, join_timeout=join_timeout,
            ray_init_config=ray_init_config, remote_configs=remote_configs, replay_buffer=replay_buffer,
            restart_nodes=restart_nodes, weight_sync_timeout=weight_sync_timeout, worker_timeout=worker_timeout,
            shutdown_timeout=shutdown_timeout, max_queued_batches=max_queued_batches, num_threads=num_threads,
            reset_when_done=reset_when_done, set_truncated=set_truncated, track_traj_ids=track_traj_ids,
            trajs_per_batch=trajs_per_batch, traj_format=traj_format, trajs_per_write=trajs_per_write,
            weight_sync_schemes=weight_sync_schemes, weight_updater=weight_updater,
            weight_recv_schemes=weight_recv_schemes,
        )  # fmt: skip

    async def _collect_one(self) -> TensorDictBase | None:
        return await self._every_node()


fill_args(DistributedCollector, _FIRST_ARGS + _SYNC_ARG + _NODE_ARGS + COLLECTOR_ARGS_DOC)
fill_args(DistributedSyncCollector, _FIRST_ARGS + _NODE_ARGS + COLLECTOR_ARGS_DOC)

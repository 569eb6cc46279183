"""RPCCollector: collection nodes driven through ``torch.distributed.rpc`` (``_workers._rpc``)."""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._core._validate import check_bool
from ._base import COLLECTOR_ARGS_DOC, NodeCollectorBase, fill_args

__all__ = ["RPCCollector"]


class RPCCollector(NodeCollectorBase):
    """Collect on nodes that are members of the trainer's torch RPC group (TensorPipe).

    The trainer launches the nodes (``launcher="mp"``: local processes; ``"submitit"``:
    SLURM jobs, or submitit's local executor; ``"ray"``: Ray tasks), they join its RPC group at
    ``master_addr:tcp_port``, and each runs ``collector_class``. With ``sync=True`` each
    batch gathers every node's share of ``frames_per_batch``, collected after any weight
    update; with ``sync=False`` (default) nodes collect ahead and each batch is the first
    node's to arrive. RPC futures are never waited on by the event loop: their callbacks
    queue the result and wake it (TorchRL's collector busy-polls them). Batches carry the
    node and worker in ``("collector", "worker_id")``, trajectory ids unique across nodes
    and the policy version they were collected with.

    torch allows one RPC group per process, so one `RPCCollector` runs at a time (a second
    raises). The group has a fixed membership: a node that dies is not replaced.

    Args:
        create_env_fn: One env factory per node (a list), or one factory with ``num_nodes``.
        policy: ``None``, an ``nn.Module`` or a TensorDict callable, sent to every node.
        frames_per_batch: Frames per yielded batch (split evenly across nodes with
            ``sync=True``).
        total_frames: Frames to collect in all; ``-1`` collects until you stop.
        num_nodes: Nodes, when ``create_env_fn`` is a single factory.
        sync: Gather every node's share each iteration, or yield the first node's batch.
        collector_class: What each node runs: `Collector` (``"single"``, default),
            `MultiSyncCollector` (``"sync"``) or `MultiAsyncCollector` (``"async"``).
        collector_kwargs: More arguments of the nodes' collectors (a dict, or one per node).
        num_workers_per_collector: Worker processes of each node's multi collector.
        launcher: ``"submitit"`` (default, as TorchRL), ``"mp"`` or ``"ray"``.
        tcp_port: The RPC rendezvous port (default: a free one).
        master_addr: The trainer's address for nodes (default: ``MASTER_ADDR``, else
            127.0.0.1 with ``"mp"`` and a local Ray, this host's address otherwise).
        backend: Accepted for TorchRL's signature: ``"gloo"`` only, as tensors travel in
            the RPC messages themselves.
        tensorpipe_options: More ``TensorPipeRpcBackendOptions`` arguments (default 16
            worker threads, as TorchRL).
        slurm_kwargs: submitit parameters, over TorchRL's defaults.
        submitit_folder: Where submitit keeps its job files and node logs.
        start_method: With ``launcher="mp"``: ``"forkserver"`` (default on Linux) or ``"spawn"``.
        ray_init_config: With ``launcher="ray"``: `ray.init` arguments (``address`` to join a
            cluster; without one a local Ray is started, and shut down at close).
        remote_configs: With ``launcher="ray"``: Ray task options of the nodes, one dict for
            all or one per node; default ``{"num_cpus": 1}``.
        update_after_each_batch: Send new weights with every batch: to every node before
            it is collected (``sync=True``) or to the node that delivered it (``sync=False``).
        max_weight_update_interval: Send weights to a node once it delivered more than this
            many batches without an update (``-1``: never).
        update_interval: Send weights to every node every this many batches (``None``: never).
        replay_buffer: A `ReplayBuffer` the trainer extends with each batch.
        weight_sync_timeout: Seconds `update_policy_weights_` waits for acknowledgements.
        worker_timeout: Seconds a busy node may go without an env step before
            `WorkerTimeoutError`.
        join_timeout: Seconds the nodes may take to join and collect their first batch.
        shutdown_timeout: Seconds each node gets to close before it is killed.
        visible_devices: ``None`` only (``NotImplementedError`` otherwise): TorchRL's CUDA
            device maps for TensorPipe; batches here travel in host memory (use
            `DistributedCollector` with ``backend="nccl"`` for CUDA tensors).
        {args}

    Examples:
        >>> import anyio
        >>> from aiocollect import RPCCollector
        >>> async def main():
        ...     async with RPCCollector(["CartPole-v1"] * 2, frames_per_batch=64, total_frames=128,
        ...                             launcher="mp", sync=True) as c:
        ...         return [b.shape async for b in c]
        >>> if __name__ == "__main__":  # nodes re-import the main module
        ...     anyio.run(main)  # doctest: +SKIP
        [torch.Size([2, 32]), torch.Size([2, 32])]
    """

    _native_scheme = "RPCWeightSyncScheme"

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
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        update_interval: int | None = None,
        launcher: str = "submitit",
        tcp_port: int | None = None,
        master_addr: str | None = None,
        backend: str = "gloo",
        tensorpipe_options: dict[str, Any] | None = None,
        start_method: str | None = None,
        replay_buffer: Any = None,
        weight_sync_timeout: float = 60.0,
        worker_timeout: float | None = 300.0,
        join_timeout: float = 300.0,
        ray_init_config: dict[str, Any] | None = None,
        remote_configs: dict[str, Any] | list[dict[str, Any]] | None = None,
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
        visible_devices: Any = None,
    ) -> None:
        check_bool("sync", sync)
        if visible_devices is not None:
            raise NotImplementedError(
                f"RPCCollector does not support visible_devices={visible_devices!r} (TensorPipe device maps for CUDA "
                "tensors): its batches travel in host memory; drop visible_devices, or use "
                "DistributedCollector(backend='nccl') for CUDA tensors"
            )
        if backend != "gloo":
            raise ValueError(
                f"RPCCollector's tensors travel in its RPC messages, so backend must be 'gloo', got {backend!r}; "
                "use DistributedCollector(backend='nccl') for GPU tensors"
            )
        self._gather = self._asked = sync
        options = {
            "launcher": launcher, "tcp_port": tcp_port, "master_addr": master_addr, "slurm_kwargs": slurm_kwargs,
            "submitit_folder": submitit_folder, "tensorpipe_options": tensorpipe_options, "start_method": start_method,
            "join_timeout": join_timeout, "ray_init_config": ray_init_config, "remote_configs": remote_configs,
        }  # fmt: skip
        self._init_nodes(
            create_env_fn, policy, transport="rpc", transport_options=options, replay_buffer=replay_buffer,
            restart_nodes=0, num_nodes=num_nodes, frames_per_batch=frames_per_batch,
            collector_class=collector_class, collector_kwargs=collector_kwargs,
            num_workers_per_collector=num_workers_per_collector, update_after_each_batch=update_after_each_batch,
            max_weight_update_interval=max_weight_update_interval, update_interval=update_interval,
            init_random_frames=init_random_frames, max_frames_per_traj=max_frames_per_traj,
            reset_at_each_iter=reset_at_each_iter, exploration_type=exploration_type, policy_factory=policy_factory,
            num_threads=num_threads, weight_sync_timeout=weight_sync_timeout, worker_timeout=worker_timeout,
            device=device, env_device=env_device, policy_device=policy_device, storing_device=storing_device,
            postproc=postproc, split_trajs=split_trajs, total_frames=total_frames,
            max_queued_batches=max_queued_batches, reset_when_done=reset_when_done, set_truncated=set_truncated,
            track_traj_ids=track_traj_ids, shutdown_timeout=shutdown_timeout,
            trajs_per_batch=trajs_per_batch, traj_format=traj_format, trajs_per_write=trajs_per_write,
            weight_sync_schemes=weight_sync_schemes, weight_updater=weight_updater,
            weight_recv_schemes=weight_recv_schemes,
        )  # fmt: skip

    async def _collect_one(self) -> TensorDictBase | None:
        return await (self._on_demand() if self._gather else self._first_node())


fill_args(RPCCollector, COLLECTOR_ARGS_DOC)

"""RayCollector: collection nodes as Ray actors (the ``ray`` transport, ``_workers._ray``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._core._validate import check_bool
from .._workers._ray import check_options
from ._base import COLLECTOR_ARGS_DOC, NodeCollectorBase, fill_args

__all__ = ["RayCollector"]


class RayCollector(NodeCollectorBase):
    """Collect on Ray actors, each running an aiocollect collector, on a local Ray or a cluster.

    Each of the ``num_collectors`` nodes is a Ray actor with the resources of its
    ``remote_configs`` entry, running ``collector_class``. With ``sync=True`` each batch
    gathers every actor's share of ``frames_per_batch``, collected after any weight update
    (shape ``[actors, *share]``); with ``sync=False`` (default) actors collect ahead and each
    batch is the first actor's to arrive. Batches carry the actor and worker in
    ``("collector", "worker_id")``, trajectory ids unique across actors, and the policy
    version they were collected with. Calls to actors are never awaited on the event loop:
    their results come back through Ray's own threads, under asyncio and trio alike.

    Ray is started (``ray.init(**ray_init_config)``) when this process is not connected to
    one, or joined when ``ray_init_config`` gives an ``address``; it is shut down when the
    last collector that started it closes, and a Ray the caller started is left running.

    Args:
        create_env_fn: One env factory per actor (a list), or one factory with
            ``num_collectors``; anything `Collector` accepts, picklable.
        policy: ``None``, an ``nn.Module`` or a TensorDict callable, sent to every actor. An
            ``nn.Module`` also defines the weights `update_policy_weights_` sends: one
            ``ray.put`` per update, acknowledged by every actor.
        frames_per_batch: Frames per yielded batch (split evenly across actors with
            ``sync=True``).
        total_frames: Frames to collect in all; ``-1`` collects until you stop.
        num_collectors: Actors, when ``create_env_fn`` is a single factory.
        sync: Gather every actor's share each iteration (on demand), or yield the first
            actor's batch (actors collect ahead).
        collector_class: What each actor runs: `Collector` (``"single"``, default),
            `MultiSyncCollector` (``"sync"``) or `MultiAsyncCollector` (``"async"``).
        collector_kwargs: More arguments of the actors' collectors (a dict, or one per actor).
        num_workers_per_collector: Worker processes of each actor's multi collector.
        ray_init_config: Arguments of ``ray.init`` when the collector starts Ray (``address``
            to join a running cluster). Default: a local instance without dashboard.
        remote_configs: Ray actor options (``num_cpus``, ``num_gpus``, ``memory``,
            ``resources``, ``scheduling_strategy``, ...), a dict for all actors or one per
            actor. Default: TorchRL's, one CPU and 2 GiB (and 0.2 GPU where CUDA exists).
        update_after_each_batch: Send new weights with every batch: to every actor before
            it is collected (``sync=True``) or to the actor that delivered it (``sync=False``).
        max_weight_update_interval: Send weights to an actor once it delivered more than
            this many batches without an update (``-1``: never).
        update_interval: Send weights to every actor every this many batches (``None``: never).
        replay_buffer: A `ReplayBuffer` the trainer extends with each batch (iteration
            yields ``None`` per batch).
        restart_nodes: How many dead actors to replace in all (re-seeded, with the current
            weights) before the death is raised. Actors are created with Ray's
            ``max_restarts=0``: the collector restarts them, so a restarted actor never
            collects with stale weights, and the restart shows in ``stats().restarts``.
        weight_sync_timeout: Seconds `update_policy_weights_` waits for acknowledgements.
        worker_timeout: Seconds a busy actor may go without an env step before
            `WorkerTimeoutError`.
        join_timeout: Seconds an actor may take to start and collect its first batch
            (which gives the trainer the batch layout).
        shutdown_timeout: Seconds each actor gets to close before it is killed.
        use_env_creator: Wrap each env factory in ``torchrl.envs.EnvCreator`` (TorchRL's option;
            needs torchrl). Ray's object store ships the factories as they are, so this is
            rarely needed.
        trust_policy: Passed to each actor's collector (see `Collector`).
        no_cuda_sync: Passed to each actor's collector (see `Collector`).
        pre_collect_hook: Called with no argument by each actor's collector before each of its
            batches, in the actor (TorchRL hands the hook to its remote collectors too).
        post_collect_hook: Called by each actor's collector with each batch it collects, in
            the actor.
        {args}

    Examples:
        >>> import anyio
        >>> from aiocollect import RayCollector
        >>> async def main():
        ...     async with RayCollector(["CartPole-v1"] * 2, frames_per_batch=64, total_frames=128, sync=True,
        ...                             ray_init_config={"num_cpus": 2}) as c:
        ...         return [b.shape async for b in c]
        >>> anyio.run(main)  # doctest: +SKIP
        [torch.Size([2, 32]), torch.Size([2, 32])]
    """

    _native_scheme = "RayWeightSyncScheme"

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        num_collectors: int | None = None,
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
        ray_init_config: dict[str, Any] | None = None,
        remote_configs: dict[str, Any] | list[dict[str, Any]] | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        update_interval: int | None = None,
        replay_buffer: Any = None,
        restart_nodes: int = 0,
        weight_sync_timeout: float = 60.0,
        worker_timeout: float | None = 300.0,
        join_timeout: float = 300.0,
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
        use_env_creator: bool = False,
        trust_policy: bool | None = None,
        no_cuda_sync: bool = False,
        pre_collect_hook: Callable[[], Any] | None = None,
        post_collect_hook: Callable[[TensorDictBase], Any] | None = None,
    ) -> None:
        check_bool("sync", sync)
        check_bool("use_env_creator", use_env_creator)
        check_bool("no_cuda_sync", no_cuda_sync)
        if trust_policy is not None:
            check_bool("trust_policy", trust_policy)
        for name, hook in (("pre_collect_hook", pre_collect_hook), ("post_collect_hook", post_collect_hook)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be a callable (run by each actor's collector) or None, got {hook!r}")
        if use_env_creator:
            create_env_fn = _with_env_creators(create_env_fn)
        self._gather = self._asked = sync
        options = {"ray_init_config": ray_init_config, "remote_configs": remote_configs, "join_timeout": join_timeout}
        # TorchRL hands these to every actor's collector (a collector_kwargs entry may not contradict them).
        node_options = {
            "trust_policy": (trust_policy, None), "no_cuda_sync": (no_cuda_sync, False),
            "pre_collect_hook": (pre_collect_hook, None), "post_collect_hook": (post_collect_hook, None),
        }  # fmt: skip
        self._init_nodes(
            create_env_fn, policy, node_options=node_options, transport="ray", transport_options=options,
            replay_buffer=replay_buffer, restart_nodes=restart_nodes, num_nodes=num_collectors,
            frames_per_batch=frames_per_batch, collector_class=collector_class, collector_kwargs=collector_kwargs,
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
        # Read back as TorchRL's attributes; the actors' collectors run them (nothing runs here).
        self._pre_collect_hook, self._post_collect_hook = pre_collect_hook, post_collect_hook
        # One actor config per node, known now: a wrong count fails here, before Ray starts.
        check_options(self._dc.mc.transport_options, self._dc.mc.num_workers)

    async def _collect_one(self) -> TensorDictBase | None:
        return await (self._on_demand() if self._gather else self._first_node())

    @property
    def num_workers(self) -> int:
        """The number of actors (TorchRL's ``num_workers``: ``num_collectors``)."""
        return self._num_workers

    def local_policy(self) -> Any:
        """The policy this process holds (TorchRL's method): what ``policy=`` was given, or ``None``."""
        return self._policy


def _with_env_creators(create_env_fn: Any) -> Any:
    """TorchRL's ``use_env_creator``: each env factory wrapped in ``torchrl.envs.EnvCreator``.

    Envs, ``EnvCreator`` objects and gymnasium ids are left as they are, as TorchRL leaves its
    envs and creators.
    """
    try:
        from torchrl.envs import EnvBase, EnvCreator
    except ImportError as exc:
        raise ImportError(
            "use_env_creator=True wraps the env factories in torchrl.envs.EnvCreator, and torchrl is not installed; "
            "install torchrl or drop use_env_creator (Ray's object store ships the factories as they are)"
        ) from exc

    def wrap(fn: Any) -> Any:
        return fn if isinstance(fn, (EnvBase, EnvCreator, str)) or not callable(fn) else EnvCreator(fn)

    return [wrap(fn) for fn in create_env_fn] if isinstance(create_env_fn, (list, tuple)) else wrap(create_env_fn)


fill_args(RayCollector, COLLECTOR_ARGS_DOC)

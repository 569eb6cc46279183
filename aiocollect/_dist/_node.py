"""A collection node: any aiocollect collector, driven by the trainer through a `WorkerChannel`.

The node is a worker like any other to the engine (the same commands and events), but what
it runs for a batch is a whole collector: `Collector`, `MultiSyncCollector` or
`MultiAsyncCollector`, with its own workers, on its own event loop (a blocking portal).
Each batch is copied into the channel's output slot with its identifiers made global:

* ``("collector", "worker_id")``: ``node * workers_per_node + local worker``;
* ``("collector", "traj_ids")``: ``(local id + generation * 2**40) * num_nodes + node``,
  unique across nodes, workers and restarts;
* ``("collector", "policy_version")``: the trainer's version number, not the node's count
  of local updates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from .._core._portal import Portal
from .._rollout._layout import BatchLayout, nested_batch_dims
from .._workers._loop import SLOTS, close_reporting, report_failure
from .._workers._messages import ApplyWeights, Close, Collect, Ready, Reset, Seed, WeightsApplied
from .._workers._transport import BUSY, PROGRESS, WorkerChannel

__all__ = ["NodeSpec", "run_node"]

_WORKER_ID = ("collector", "worker_id")
_TRAJ_IDS = ("collector", "traj_ids")
_VERSION = ("collector", "policy_version")


@dataclass(frozen=True)
class NodeSpec:
    """What a collection node builds (cloudpickled: factories may be lambdas)."""

    node: int
    num_nodes: int
    collector_class: type
    create_env_fn: Any
    workers_per_node: int
    policy: Any
    policy_factory: Any
    frames_per_batch: int
    kwargs: dict[str, Any]  # the rest of the local collector's arguments
    seed: Any  # a numpy SeedSequence, or None
    policy_version: int
    load_weights: bool
    generation: int  # restarts of this node so far


def run_node(channel: WorkerChannel, spec_bytes: bytes) -> None:
    """Run one collection node until it is closed or fails; a failure is sent as `Failed`."""
    node: _Node | None = None
    failed = False
    try:
        import cloudpickle

        node = _Node(channel, cloudpickle.loads(spec_bytes))
        if node.start():
            node.serve()
    except BaseException as exc:
        failed = True
        report_failure(channel, exc, None)  # a node counts batches, not env steps: no step to report
    finally:
        if node is not None:
            close_reporting(channel, node.close, failed)  # its collector's close may fail (an env's)


def _layout(batch: Any) -> BatchLayout:
    from tensordict import TensorDict

    if not isinstance(batch, TensorDict):
        raise TypeError(
            f"a node's batches must have a fixed layout, but its collector yields {type(batch).__name__} (a "
            "heterogeneous or dynamic env); collect such envs with a multi-process collector instead"
        )
    layout = []
    for key, value in batch.items(include_nested=True, leaves_only=True):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"a node's batches must hold tensors only, but {key!r} holds {type(value).__name__}")
        layout.append((key, tuple(value.shape), value.dtype))
    return BatchLayout(layout, shape=tuple(batch.batch_size), nested=nested_batch_dims(batch))


class _Node:
    def __init__(self, channel: WorkerChannel, spec: NodeSpec) -> None:
        self.channel, self.spec = channel, spec
        self.batches = 0
        # The blocking twins' portal: a call costs one thread round trip, not anyio's two.
        self.portal = Portal("aiocollect node", "aiocollect node")
        self.collector: Any = None
        self.iterator: Any = None
        self.prefetched: Any = None
        self.slots: list[dict[Any, Any]] = []
        self.versions = [spec.policy_version]  # trainer version of each local policy version
        self.stopped = False  # the trainer said stop: collect nothing more
        self._scope: Any = None  # the cancel scope of the batch in progress (on the portal's loop)

    def _build(self) -> Any:
        spec = self.spec
        kwargs = dict(spec.kwargs, frames_per_batch=spec.frames_per_batch, total_frames=-1)
        if spec.collector_class.__name__ == "Collector":
            policy = spec.policy if spec.policy_factory is None else spec.policy_factory()
            return spec.collector_class(spec.create_env_fn, policy, **kwargs)
        return spec.collector_class(
            spec.create_env_fn,
            spec.policy,
            num_workers=spec.workers_per_node,
            policy_factory=spec.policy_factory,
            **kwargs,
        )

    def start(self) -> bool:
        spec, portal = self.spec, self.portal
        self.channel.setup(spec)
        self.collector = portal.call(self._build)
        # The trainer's liveness sees the node's env steps, and a stop ends its batch at once.
        self.channel.attach_runner(self.collector._activity, self.interrupt)
        if spec.seed is not None:
            self._seed(spec.seed)
        if spec.load_weights:  # updates were published since the trainer pickled the policy
            self._apply(spec.policy_version)
        self.iterator = self.collector.__aiter__()
        # The first batch tells the trainer the node's layout; it is delivered first (unless
        # a command makes it stale), so it costs nothing.
        self.prefetched = self._next_batch()
        if self.prefetched is None:
            return False
        layout = _layout(self.prefetched)
        self.slots = self.channel.output_slots(layout, SLOTS)
        if not self.slots:
            return False
        self.channel.send(Ready(os.getpid(), layout))
        return True

    def _seed(self, seeds: Any) -> None:
        self.portal.call(self.collector.set_seed, int(seeds.generate_state(1)[0]))

    def _apply(self, version: int) -> int:
        """Load the newest published weights into the node's collector; returns their version."""

        def load(weights: Any) -> None:
            self.portal.call(self.collector.update_policy_weights_, dict(weights))

        got = self.channel.read_weights(load)
        version = version if got is None else max(version, got)
        self.versions.append(version)
        return version

    def interrupt(self) -> None:
        """End the batch in progress and collect no more (any thread: the trainer said stop)."""
        self.stopped = True
        scope = self._scope
        if scope is not None:
            try:
                self.portal.call(scope.cancel)
            except RuntimeError:  # the portal is already gone: so is the batch
                pass

    async def _collect(self) -> Any:
        from anyio import CancelScope

        with CancelScope() as scope:
            self._scope = scope
            if self.stopped:  # set before the scope was visible to `interrupt`
                scope.cancel()
            try:
                return await self.iterator.__anext__()
            finally:
                self._scope = None
        return None  # cancelled by `interrupt`

    def _next_batch(self) -> Any:
        """The local collector's next batch, or None once the trainer said stop."""
        return None if self.stopped else self.portal.call(self._collect)

    def serve(self) -> None:
        channel, control = self.channel, self.channel.control
        while True:
            control[BUSY] = 0
            cmd = channel.receive()
            control[BUSY] = 1
            control[PROGRESS] += 1
            if self.stopped and not isinstance(cmd, Close):
                # Shutting down: the trainer reads nothing more, but its weight transfers
                # must still be received, or its sends would wait on this node.
                if isinstance(cmd, ApplyWeights):
                    channel.read_weights(lambda weights: None)
                continue
            if isinstance(cmd, Collect):
                batch, self.prefetched = self.prefetched, None
                if batch is None:
                    batch = self._next_batch()
                    if batch is None:
                        continue  # stopped in the middle of the batch
                self._write(batch, self.slots[cmd.slot])
                self.batches += 1
                control[PROGRESS] += 1
                channel.batch_ready(cmd.slot)
            elif isinstance(cmd, ApplyWeights):
                version = self._apply(cmd.version)
                self.prefetched = None  # collected with the old weights
                channel.send(WeightsApplied(version))
            elif isinstance(cmd, Seed):
                self._seed(cmd.seeds)
                self.prefetched = None
            elif isinstance(cmd, Reset):
                self.portal.call(self.collector.reset)
                self.prefetched = None
            elif isinstance(cmd, Close):
                return
            else:  # AttachStorage never comes: this transport's memory is "none"
                raise RuntimeError(f"a collection node cannot handle {cmd!r}")

    def _write(self, batch: Any, slot: dict[Any, Any]) -> None:
        spec = self.spec
        with torch.no_grad():
            for key, out in slot.items():
                out.copy_(batch.get(key), non_blocking=False)
            wid = slot.get(_WORKER_ID)
            if wid is not None:
                wid.add_(spec.node * spec.workers_per_node)
            traj = slot.get(_TRAJ_IDS)
            if traj is not None:
                valid = traj >= 0
                traj.copy_(torch.where(valid, (traj + (spec.generation << 40)) * spec.num_nodes + spec.node, traj))
            version = slot.get(_VERSION)
            if version is not None:
                table = torch.tensor(self.versions, dtype=version.dtype, device=version.device)
                local = version.clamp(0, len(self.versions) - 1)
                version.copy_(torch.where(version >= 0, table[local], version))

    def close(self) -> None:
        try:
            if self.collector is not None:
                self.portal.call(self.collector.aclose, interruptible=False)
        finally:
            self.portal.stop(final=True)  # a late `interrupt` must not start a new loop

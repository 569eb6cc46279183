"""The worker loop: build env and policy, then collect into the slots a transport provides.

It knows nothing about processes, sockets or shared memory. It talks through a
`WorkerChannel` and runs the same rollout engine as the in-process `Collector`. It imports
torch and numpy but not tensordict, so a worker with a plain ``nn.Module`` policy (or none)
starts without paying for it.
"""

from __future__ import annotations

import os
import pickle
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ._messages import (
    ApplyWeights,
    AttachStorage,
    BatchReady,
    Close,
    Collect,
    Failed,
    LoadWeights,
    Ready,
    RemoteCall,
    Reset,
    Seed,
    SetHook,
    WorkerSpec,
)
from ._transport import BUSY, PREEMPT, PROGRESS, STOP, WorkerChannel

__all__ = ["SLOTS", "close_reporting", "pack_spec", "report_failure", "run_worker"]

SLOTS = 2  # double buffering: a worker fills one slot while the engine reads the other

# Worker threads of one process (the inline backend) that free their rollouts' step views (a
# few thousand tensors each) at the same moment keep handing the GIL around: 64 of them took
# 0.85-1.3 s to close, one after another 0.1 s (docs/benchmarks.md, "Node count").
_FREE_ONE_AT_A_TIME = threading.Lock()


def pack_spec(spec: bytes, init_fn: bytes | None) -> bytes:
    """What a transport hands `run_worker`: the cloudpickled `WorkerSpec`, and ``init_fn`` apart.

    Apart, so the worker calls ``init_fn`` before it unpickles anything else: unpickling the
    env factory may import modules that only work once ``init_fn`` has run (a simulator's app
    launcher, a ``sys.path`` entry). A plain tuple of bytes imports nothing when loaded.
    """
    return pickle.dumps((init_fn, spec), protocol=pickle.HIGHEST_PROTOCOL)


def run_worker(channel: WorkerChannel, spec_bytes: bytes) -> None:
    """Run one worker until it is closed or fails; a failure is sent as `Failed`, never raised."""
    worker: _Worker | None = None
    failed = False
    try:
        import cloudpickle

        init_fn, packed = pickle.loads(spec_bytes)
        if init_fn is not None:
            cloudpickle.loads(init_fn)()  # TorchRL's init_fn: first, before anything is built
        spec: WorkerSpec = cloudpickle.loads(packed)
        worker = _Worker(channel, spec)
        if worker.start():
            worker.serve()
    except BaseException as exc:
        failed = True
        report_failure(channel, exc, None if worker is None or worker.rollout is None else worker.rollout.steps_done)
    finally:
        if worker is not None and worker.rollout is not None:
            rollout = worker.rollout
            try:
                close_reporting(channel, rollout.env.close, failed)
            finally:
                with _FREE_ONE_AT_A_TIME:
                    rollout.drop_views()


def close_reporting(channel: WorkerChannel, close: Callable[[], object], failed: bool) -> None:
    """Run ``close()`` (a worker's or a node's last step); its error is sent as `Failed`.

    The engine reads it while stopping the worker (`Transport.close_failures`) and raises it, as
    the in-process Collector raises its env's. After a failure already sent (``failed``), that
    one is the story and this one is not sent.
    """
    try:
        close()
    except BaseException as exc:
        if not failed:
            report_failure(channel, exc, None)


def report_failure(channel: WorkerChannel, exc: BaseException, step: int | None) -> None:
    """Send ``exc`` (being handled) to the engine as `Failed`, with its traceback; never raises."""
    try:
        payload: bytes | None = pickle.dumps(exc)
    except Exception:
        payload = None
    try:
        channel.send(Failed(step, payload, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    except (OSError, EOFError):
        pass  # the engine is gone


class _Worker:
    def __init__(self, channel: WorkerChannel, spec: WorkerSpec) -> None:
        self.channel, self.spec = channel, spec
        self.rollout: Any = None
        self.slots: list[dict[Any, Any]] = []
        self.storage: dict[Any, Any] | None = None
        self.layout: Any = None
        self.view: Any = None  # a WorkerView: the hooks and what map_fn/get_distant_attr see
        self.out: Any = None  # the last batch: its slot's (or buffer rows') tensors, or a pickled layout's TensorDict

    def start(self) -> bool:
        """Build everything and get the output slots; False if closed during start-up."""
        import torch

        from .._core._seeding import TrajCounter
        from .._envs._base import AsyncBatchedEnv
        from .._envs._own_loop import OwnLoopEnv
        from .._rollout._config import make_env
        from .._rollout._factory import make_rollout
        from .._rollout._policy import PolicyAdapter
        from ._updates import restore_version
        from ._weights import load_into, unpack_state

        spec, c = self.spec, self.spec.collector
        self.channel.setup(spec)
        env = make_env(c)
        if isinstance(env, AsyncBatchedEnv):  # coroutine envs: on an event loop of this worker's own
            if getattr(env, "min_ready", None) is not None:
                env.close()
                raise ValueError(
                    "a barrier-free AsyncEnvPool (min_ready=) runs in the in-process Collector; worker "
                    "processes step their pools lock-step: drop min_ready, or collect with Collector"
                )
            env.cancel_grace = c.shutdown_timeout
            env = OwnLoopEnv(env)
        try:
            policy = spec.policy if spec.policy_factory is None else spec.policy_factory()
            adapter = PolicyAdapter(policy, policy_device=c.policy_device, exploration_type=c.exploration_type)
            adapter.trusted = bool(c.trust_policy)
            if spec.load_weights:  # updates were published since the engine pickled the policy
                self.channel.read_weights(lambda state: load_into(adapter.policy, state))
            if spec.weights is not None:  # weights sent to this worker alone
                load_into(adapter.policy, unpack_state(spec.weights))
            adapter.version = spec.policy_version
            generator = torch.Generator()
            generator.seed()
            rollout = make_rollout(
                env, adapter, c, traj_counter=TrajCounter(spec.traj_start, spec.num_workers), generator=generator,
                stop=threading.Event(), worker_id=spec.worker_id,
            )  # fmt: skip
        except BaseException:
            env.close()
            raise
        self.rollout = rollout
        if spec.policy_version:  # restarted, or restored: a PolicyVersion transform goes on from there
            restore_version(rollout, spec.policy_version)
        if spec.seed is not None:
            self._seed(spec.seed)
        rollout.prepare()
        layout = self.layout = rollout.output_layout()
        from ._view import WorkerView

        self.view = WorkerView(spec, rollout, layout)
        self.slots = self.channel.output_slots(layout, SLOTS)
        if not self.slots:
            return False  # the collector shut down while this worker was starting
        self.channel.send(Ready(os.getpid(), layout))
        return True

    def _seed(self, seeds: Any) -> None:
        from .._core._seeding import SeedPlan

        plan = SeedPlan(seeds)
        plan.apply_rngs(self.rollout.generator)
        n = max(1, self.rollout.spec.numel)
        if getattr(self.rollout.env, "_seeds_as_given", False) and seeds.spawn_key:
            # A TorchRL env: seeded as TorchRL's multi-process collectors seed worker w, with
            # the user's seed carried through the envs of the workers before it.
            from .._envs._torchrl import chained_seed

            given = chained_seed(int(seeds.entropy), seeds.spawn_key[-1] * n)
            self.rollout.request_reset([given] * n)
            return
        self.rollout.request_reset(plan.env_seeds(n))

    def serve(self) -> None:
        """Handle commands in order until `Close` (a weight update may overtake queued collects)."""
        from ._updates import CommandQueue, apply_weights

        channel, control, rollout = self.channel, self.channel.control, self.rollout
        commands = CommandQueue(channel)
        while True:
            control[BUSY] = 0
            cmd = commands.next(rollout.policy.version)
            control[BUSY] = 1
            control[PROGRESS] += 1
            if isinstance(cmd, Collect):
                self.view.before_batch()
                payload = self._collect(cmd)
                if not control[STOP]:  # a batch cut short by shutdown is never handed over: no hook sees it
                    self.view.after_batch(self.out)  # the hooks see the batch before the engine does
                if payload is None:
                    channel.batch_ready(cmd.slot)
                else:
                    channel.send(BatchReady(cmd.slot, payload))
            elif isinstance(cmd, (ApplyWeights, LoadWeights)):
                apply_weights(rollout, channel, cmd)
            elif isinstance(cmd, AttachStorage):
                self.storage = channel.storage(cmd.handle)
            elif isinstance(cmd, Seed):
                self._seed(cmd.seeds)
            elif isinstance(cmd, Reset):
                rollout.request_reset()
            elif isinstance(cmd, RemoteCall):
                channel.send(self.view.answer(cmd))
            elif isinstance(cmd, SetHook):
                self.view.set_hook(cmd)
            elif isinstance(cmd, Close):
                self.view.close()
                return
            else:  # pragma: no cover - a protocol bug, reported like any worker error
                raise RuntimeError(f"unknown worker command {cmd!r}")

    def _collect(self, cmd: Collect) -> bytes | None:
        """Collect one batch into its slot (or the buffer's rows); a batch with no fixed layout is returned pickled."""
        control, preemptible, seq = self.channel.control, self.spec.preemptible, cmd.seq

        def preempt() -> bool:  # polled before every env step
            control[PROGRESS] += 1
            return control[STOP] != 0 or (preemptible and control[PREEMPT] == seq)

        rollout, slot = self.rollout, self.slots[cmd.slot]
        if self.layout.pickled:
            self.out = rollout.collect(cmd.random, preempt=preempt)
            return pickle.dumps(self.out)
        pieces = cmd.pieces
        if pieces is not None and len(pieces) == 1 and self.storage is not None:
            # Straight into the replay buffer's rows: the batch is copied exactly once.
            start, n = pieces[0]
            shape = slot[("collector", "worker_id")].shape
            out = {k: t[start : start + n].view(*shape, *t.shape[1:]) for k, t in self.storage.items()}
            rollout.collect_into(cmd.random, out, preempt=preempt)
            self.out = out
            return None
        rollout.collect_into(cmd.random, slot, preempt=preempt)
        self.out = slot
        if pieces is not None and self.storage is not None:
            # The rows wrap around the end of the ring: copy in two runs.
            offset = 0
            for start, n in pieces:
                for k, t in self.storage.items():
                    t[start : start + n].copy_(slot[k].reshape(-1, *t.shape[1:])[offset : offset + n])
                offset += n
        return None

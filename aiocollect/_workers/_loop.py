"""The worker loop: build env and policy, then collect into the slots a transport provides.

It knows nothing about processes, sockets or shared memory. It talks through a
`WorkerChannel` and runs the same rollout engine as the in-process `Collector`. It imports
torch and numpy but not tensordict, so a worker with a plain ``nn.Module`` policy (or none)
starts without paying for it.
"""

from __future__ import annotations

import math
import os
import pickle
import threading
import traceback
from typing import Any

from ._messages import (
    ApplyWeights,
    AttachStorage,
    Close,
    Collect,
    Failed,
    Ready,
    Reset,
    Seed,
    WeightsApplied,
    WorkerSpec,
)
from ._transport import BUSY, PREEMPT, PROGRESS, STOP, WorkerChannel

__all__ = ["SLOTS", "report_failure", "run_worker"]

SLOTS = 2  # double buffering: a worker fills one slot while the engine reads the other


def run_worker(channel: WorkerChannel, spec_bytes: bytes) -> None:
    """Run one worker until it is closed or fails; a failure is sent as `Failed`, never raised."""
    worker: _Worker | None = None
    try:
        import cloudpickle

        spec: WorkerSpec = cloudpickle.loads(spec_bytes)
        worker = _Worker(channel, spec)
        if worker.start():
            worker.serve()
    except BaseException as exc:
        report_failure(channel, exc, None if worker is None or worker.rollout is None else worker.rollout.steps_done)
    finally:
        if worker is not None and worker.rollout is not None:
            worker.rollout.env.close()


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


def _load_weights(policy: Any, source: Any) -> None:
    import torch

    # state_dict() tensors share storage with the parameters and buffers: copy_ updates them.
    with torch.no_grad():
        for name, t in policy.state_dict().items():
            t.copy_(source[name])


class _Worker:
    def __init__(self, channel: WorkerChannel, spec: WorkerSpec) -> None:
        self.channel, self.spec = channel, spec
        self.rollout: Any = None
        self.slots: list[dict[Any, Any]] = []
        self.storage: dict[Any, Any] | None = None

    def start(self) -> bool:
        """Build everything and get the output slots; False if closed during start-up."""
        import torch

        from .._core._seeding import TrajCounter
        from .._envs._base import AsyncBatchedEnv
        from .._envs._own_loop import OwnLoopEnv
        from .._rollout._config import make_env
        from .._rollout._policy import PolicyAdapter
        from .._rollout._rollout import Rollout

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
            adapter.bind(env.spec, counts_steps=c.max_frames_per_traj is not None)
            if spec.load_weights:  # updates were published since the engine pickled the policy
                _load_weights(adapter.policy, self.channel.weights())
            adapter.version = spec.policy_version
            generator = torch.Generator()
            generator.seed()
            rollout = Rollout(
                env, adapter, steps=math.ceil(c.frames_per_batch / max(1, env.spec.numel)),
                traj_counter=TrajCounter(spec.traj_start, spec.num_workers), generator=generator,
                max_frames_per_traj=c.max_frames_per_traj, set_truncated=c.set_truncated,
                reset_at_each_iter=c.reset_at_each_iter, env_device=c.env_device, storing_device=None,
                track_traj_ids=c.track_traj_ids, stop=threading.Event(), worker_id=spec.worker_id,
            )  # fmt: skip
        except BaseException:
            env.close()
            raise
        self.rollout = rollout
        if spec.seed is not None:
            self._seed(spec.seed)
        rollout.prepare()
        layout = rollout.output_layout()
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
        """Handle commands strictly in order until `Close`."""
        channel, control, rollout = self.channel, self.channel.control, self.rollout
        while True:
            control[BUSY] = 0
            cmd = channel.receive()
            control[BUSY] = 1
            control[PROGRESS] += 1
            if isinstance(cmd, Collect):
                self._collect(cmd)
                channel.batch_ready(cmd.slot)
            elif isinstance(cmd, ApplyWeights):
                adapter = rollout.policy
                with adapter.lock:
                    _load_weights(adapter.policy, channel.weights())
                    adapter.version = cmd.version
                channel.send(WeightsApplied(cmd.version))
            elif isinstance(cmd, AttachStorage):
                self.storage = channel.storage(cmd.handle)
            elif isinstance(cmd, Seed):
                self._seed(cmd.seeds)
            elif isinstance(cmd, Reset):
                rollout.request_reset()
            elif isinstance(cmd, Close):
                return
            else:  # pragma: no cover - a protocol bug, reported like any worker error
                raise RuntimeError(f"unknown worker command {cmd!r}")

    def _collect(self, cmd: Collect) -> None:
        control, preemptible, seq = self.channel.control, self.spec.preemptible, cmd.seq

        def preempt() -> bool:  # polled before every env step
            control[PROGRESS] += 1
            return control[STOP] != 0 or (preemptible and control[PREEMPT] == seq)

        rollout, slot = self.rollout, self.slots[cmd.slot]
        pieces = cmd.pieces
        if pieces is not None and len(pieces) == 1 and self.storage is not None:
            # Straight into the replay buffer's rows: the batch is copied exactly once.
            start, n = pieces[0]
            shape = slot[("collector", "worker_id")].shape
            out = {k: t[start : start + n].view(*shape, *t.shape[1:]) for k, t in self.storage.items()}
            rollout.collect_into(cmd.random, out, preempt=preempt)
            return
        rollout.collect_into(cmd.random, slot, preempt=preempt)
        if pieces is not None and self.storage is not None:
            # The rows wrap around the end of the ring: copy in two runs.
            offset = 0
            for start, n in pieces:
                for k, t in self.storage.items():
                    t[start : start + n].copy_(slot[k].reshape(-1, *t.shape[1:])[offset : offset + n])
                offset += n

"""The loop that runs inside a worker: build env and policy, then obey small commands.

Protocol (tuples over the worker's connection; tensors never travel through it):

parent -> worker: ``("slots", n, slot_bytes)`` followed by the block's fd (``n`` slots, then
`CONTROL_WORDS` int64 control words: the sequence number of a batch to cut short and a stop
flag that cuts any batch short at shutdown, written by the parent; a progress count the
worker bumps at every env step and command, and a busy flag it holds while it has work, read
by the parent's liveness check), ``("storage", handle,
has_fd)`` (a replay buffer's storage to write into; followed by its fd if ``has_fd``),
``("collect", slot, random, seq, pieces)`` (``pieces``: ``None`` to fill ``slot``, or the
buffer rows to fill), ``("weights", version)``, ``("seed", SeedSequence)``, ``("reset",)``,
``("close",)``.

worker -> parent: ``("layout", layout)``, ``("ready", pid)``, ``("batch", slot)``, ``("ack",
version)``, ``("error", step, pickled exception or None, "Type: message", traceback text)``.

Commands are handled strictly in order, between batches, so a weight update never lands in
the middle of a batch.
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Any

__all__ = ["CONTROL_WORDS", "WorkerConfig", "worker_main"]

# Indices of the control words that follow a worker's slots.
_PREEMPT, _STOP, _PROGRESS, _BUSY = range(4)
CONTROL_WORDS = 4


@dataclass
class WorkerConfig:
    """Everything a worker needs, sent once at start (cloudpickled: factories may be lambdas)."""

    worker_id: int
    num_workers: int
    collector: Any  # a validated CollectorConfig for this worker
    policy: Any  # an nn.Module, a callable, or None
    policy_factory: Any
    num_sub_threads: int
    weights_layout: Any  # Layout of the shared weight block, or None
    policy_version: int
    seed: Any  # numpy SeedSequence or None
    traj_start: int  # first trajectory id this worker may use (restarted workers move on)
    preemptible: bool = False  # poll the control word every step (MultiSync's preemptive_threshold)


def _load_weights(policy: Any, views: dict[str, Any]) -> None:
    import torch

    # state_dict() tensors share storage with the parameters and buffers: copy_ updates them.
    with torch.no_grad():
        for name, t in policy.state_dict().items():
            t.copy_(views[name])


def _watch_parent(alive: Any) -> None:
    # The parent holds the other end; EOF means it died (even by SIGKILL): exit at once.
    try:
        alive.recv_bytes()
    except (EOFError, OSError):
        pass
    os._exit(1)


def worker_main(conn: Any, alive: Any, config_bytes: bytes, weights_fd: Any, weights_bytes: int) -> None:
    """Entry point of a worker (module level, so the ``spawn`` start method can import it)."""
    # Ctrl-C goes to the whole process group; the parent decides how workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(alive,), name="aiocollect parent watcher", daemon=True).start()
    step = None
    rollout = None
    try:
        import cloudpickle

        cfg: WorkerConfig = cloudpickle.loads(config_bytes)
        rollout = _setup(conn, cfg, weights_fd, weights_bytes)
        step = 0
        if rollout is not None:
            _serve(conn, cfg, rollout)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never swallowed
        if rollout is not None:
            step = rollout.steps_done
        try:
            payload: bytes | None = pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text
            payload = None
        try:
            conn.send(("error", step, payload, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        except (OSError, EOFError):
            pass
    finally:
        if rollout is not None:
            rollout.env.close()
    # Skip interpreter teardown (seconds with torch loaded): nothing is left to flush but stdio.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _setup(conn: Any, cfg: WorkerConfig, weights_fd: Any, weights_bytes: int) -> Any:
    """Build env, policy and rollout and receive the slots; ``None`` if told to close first."""
    from multiprocessing.reduction import recv_handle

    import torch

    from .._config import make_env
    from .._policy import PolicyAdapter
    from .._rollout import Rollout, TrajCounter
    from .._seeding import SeedPlan
    from .._shm import SharedBlock

    torch.set_num_threads(cfg.num_sub_threads)
    c = cfg.collector
    env = make_env(c)
    try:
        policy = cfg.policy if cfg.policy_factory is None else cfg.policy_factory()
        adapter = PolicyAdapter(policy, policy_device=c.policy_device, exploration_type=c.exploration_type)
        adapter.bind(env.spec)
        if cfg.weights_layout is not None:
            block = SharedBlock(weights_bytes, weights_fd.detach())
            block.close_fd()
            adapter.shared_weights = block.views(cfg.weights_layout)
            _load_weights(adapter.policy, adapter.shared_weights)
        adapter.version = cfg.policy_version
        generator = torch.Generator()
        generator.seed()
        rollout = Rollout(
            env, adapter, steps=math.ceil(c.frames_per_batch / max(1, env.spec.numel)),
            traj_counter=TrajCounter(cfg.traj_start, cfg.num_workers), generator=generator,
            max_frames_per_traj=c.max_frames_per_traj, set_truncated=c.set_truncated,
            reset_at_each_iter=c.reset_at_each_iter, env_device=c.env_device, storing_device=None,
            track_traj_ids=c.track_traj_ids, stop=threading.Event(), worker_id=cfg.worker_id,
        )  # fmt: skip
        if cfg.seed is not None:
            plan = SeedPlan(cfg.seed)
            plan.apply_rngs(generator)
            rollout.request_reset(plan.env_seeds(max(1, env.spec.numel)))
        rollout.prepare()
        layout = rollout.output_layout()
        conn.send(("layout", layout))
        msg = conn.recv()
        if msg[0] == "close":  # the collector shut down while this worker was starting
            env.close()
            return None
        kind, n_slots, slot_bytes = msg
        if kind != "slots":  # pragma: no cover - a protocol bug, reported like any worker error
            raise RuntimeError(f"worker expected 'slots' during start-up, got {kind!r}")
        block = SharedBlock(n_slots * slot_bytes + 64, recv_handle(conn))
        block.close_fd()
        rollout.slots = [block.views(layout, i * slot_bytes) for i in range(n_slots)]
        # A numpy view: polled before every env step, so reading it must cost next to nothing.
        rollout.control = block.views([("control", (CONTROL_WORDS,), torch.int64)], n_slots * slot_bytes)["control"].numpy()
        rollout.storage = None
        conn.send(("ready", os.getpid()))
        return rollout
    except BaseException:
        env.close()
        raise


def _serve(conn: Any, cfg: WorkerConfig, rollout: Any) -> None:
    control = rollout.control
    while True:
        control[_BUSY] = 0
        cmd = conn.recv()
        control[_BUSY] = 1
        control[_PROGRESS] += 1
        kind = cmd[0]
        if kind == "collect":
            _collect(rollout, cfg, *cmd[1:])
            conn.send(("batch", cmd[1]))
        elif kind == "storage":
            from multiprocessing.reduction import recv_handle

            from .._storage import attach_storage

            rollout.storage = attach_storage(cmd[1], recv_handle(conn) if cmd[2] else None)
        elif kind == "weights":
            adapter = rollout.policy
            with adapter.lock:
                _load_weights(adapter.policy, adapter.shared_weights)
                adapter.version = cmd[1]
            conn.send(("ack", cmd[1]))
        elif kind == "seed":
            from .._seeding import SeedPlan

            plan = SeedPlan(cmd[1])
            plan.apply_rngs(rollout.generator)
            rollout.request_reset(plan.env_seeds(max(1, rollout.spec.numel)))
        elif kind == "reset":
            rollout.request_reset()
        elif kind == "close":
            return
        else:  # pragma: no cover - a protocol bug, reported like any worker error
            raise RuntimeError(f"unknown worker command {kind!r}")


def _collect(rollout: Any, cfg: WorkerConfig, slot: int, random: bool, seq: int, pieces: Any) -> None:
    control = rollout.control

    def preempt() -> bool:  # polled before every env step
        control[_PROGRESS] += 1
        return control[_STOP] != 0 or (cfg.preemptible and control[_PREEMPT] == seq)  # type: ignore[no-any-return]

    if pieces is not None and len(pieces) == 1:
        # Straight into the replay buffer's rows: the batch is copied exactly once.
        start, n = pieces[0]
        shape = rollout.slots[slot][("collector", "worker_id")].shape
        out = {k: t[start : start + n].view(*shape, *t.shape[1:]) for k, t in rollout.storage.items()}
        rollout.collect(random, out=out, preempt=preempt)
        return
    batch = rollout.collect(random, out=rollout.slots[slot], preempt=preempt)
    if pieces is not None:  # the rows wrap around the end of the ring: copy in two runs
        offset = 0
        for start, n in pieces:
            for k, t in rollout.storage.items():
                t[start : start + n].copy_(batch.get(k).reshape(-1, *t.shape[1:])[offset : offset + n])
            offset += n

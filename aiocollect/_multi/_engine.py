"""The engine shared by the multi-worker collectors: workers, weights, supervision, liveness.

The parent never touches an env. Each worker runs the worker loop (``_workers._loop``) and
writes each batch into one of its output slots (or, with a replay buffer, straight into the
buffer's rows); the engine reads a finished slot and hands it back. Where workers run and
how slots, weights and signals reach them is the `Transport`'s business: this module never
sees a process, a file descriptor or shared memory.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import anyio
import cloudpickle
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from .._buffer._storage import SharedMemoryStorage
from .._collect._lifecycle import CollectorLifecycle
from .._core._errors import (
    WorkerCrashedError,
    WorkerTimeoutError,
    first_failure,
    worker_error_from_message,
)
from .._core._seeding import check_seed
from .._core._threads import to_thread
from .._rollout._layout import restore_nested
from .._workers import get_transport
from .._workers._loop import SLOTS, pack_spec
from .._workers._messages import Collect, Reset, Seed, WorkerSpec
from .._workers._transport import Transport
from ._calls import WorkerCalls
from ._config import MultiConfig
from ._liveness import STALL_REPORT, Liveness, process_state
from ._pump import Pump
from ._weights import EngineWeights

__all__ = ["SLOTS", "MultiCollectorBase"]


class MultiCollectorBase(EngineWeights, WorkerCalls, CollectorLifecycle):
    """What `MultiSyncCollector` and `MultiAsyncCollector` share (not public)."""

    _worker_noun = "workers"  # what errors call the units the transport runs
    _restart_arg = "restart_workers"  # the argument that restarts them

    def _init_multi(self, mc: MultiConfig, policy: Any, replay_buffer: Any, **traj_args: Any) -> None:
        self._mc, self._cfg = mc, mc.cfg
        self._transport_class = get_transport(mc.backend)
        self._transport: Transport | None = None
        self._policy = policy
        self._num_workers = n = mc.num_workers
        self._restarts_left = mc.restart_workers
        self._restarts = self._dropped_batches = self._seq = 0
        self._generation = [0] * n
        self._seed_root: np.random.SeedSequence | None = None
        self._worker_seeds: list[Any] = [None] * n
        self._init_weights(mc, policy)
        self._outstanding: list[dict[int, Any]] = [{} for _ in range(n)]  # slot -> reservation (or None)
        self._idle: list[list[int]] = [list(range(SLOTS)) for _ in range(n)]  # slots free to dispatch
        self._batch_shapes: dict[int, tuple[int, ...]] = {}
        self._layouts: dict[int, Any] = {}  # each worker's BatchLayout (nested batch dims, pickled batches)
        self._saved_threads: int | None = None
        self._pump: Pump | None = None
        self._liveness = Liveness(n)
        self._worker_frames, self._worker_batches = [0] * n, [0] * n  # delivered by each worker (stats)
        try:
            self._init_fn_bytes = None if mc.init_fn is None else cloudpickle.dumps(mc.init_fn)
        except Exception as exc:
            raise TypeError(
                f"init_fn cannot be pickled for the worker processes ({exc}); pass a module-level function, "
                "a lambda or a functools.partial that holds no lock, socket or open file"
            ) from exc
        for w in range(n):  # fail on unpicklable factories now, before anything is spawned
            self._spec_bytes(w)
        self._init_lifecycle(
            mc.cfg.total_frames, mc.total_fpb, mc.cfg.max_queued_batches, replay_buffer, **traj_args,
            postprocessing=mc.cfg.split_trajs or mc.cfg.postproc is not None, split_trajs=bool(mc.cfg.split_trajs),
            reset_at_each_iter=bool(mc.cfg.reset_at_each_iter),
        )  # fmt: skip
        rb, memory = self._rb, self._transport_class.memory
        # TorchRL buffers take whole batches from the parent, and so does a storage on a device
        # (the parent copies each batch there).
        direct = rb is not None and rb.direct_writes and rb.storage.device is None
        if direct and memory == "host" and not rb.storage.shareable:
            if rb.storage.built:
                raise TypeError(
                    f"the replay buffer's {type(rb.storage).__name__} lives in this process only; worker processes "
                    "write into SharedMemoryStorage or MemmapStorage: pass storage=SharedMemoryStorage() to it"
                )
            rb.storage = SharedMemoryStorage(ndim=rb.storage.ndim)  # not built yet: no data to move
        # Post-processing (and trajectory assembly) runs in the parent, so those batches
        # reach the buffer through it, as do all batches of workers that cannot reach the
        # buffer's memory; all others are written by the workers themselves.
        self._direct = direct and self._batch_rb is not None and not self._needs_post() and memory != "none"
        # Workers collect on the env/policy devices; the parent moves batches to storing_device.
        self._post_in_parent = self._needs_post() or self._cfg.storing_device is not None

    def _spec_bytes(self, w: int) -> bytes:
        mc = self._mc
        spec = WorkerSpec(
            worker_id=w, num_workers=self._num_workers, collector=mc.worker_cfgs[w],
            policy=None if mc.factories[w] is not None else self._policy, policy_factory=mc.factories[w],
            num_sub_threads=mc.num_sub_threads, policy_version=self._targets[w], load_weights=self._published,
            seed=self._worker_seeds[w], traj_start=w + self._num_workers * (self._generation[w] << 40),
            preemptible=mc.preemptive_threshold is not None, pre_collect_hook=self._pre_collect_hook,
            post_collect_hook=self._post_collect_hook, profiler=self._worker_profiler(w),
            weights=self._own_weights[w],
        )  # fmt: skip
        try:
            packed = cloudpickle.dumps(spec)
        except Exception as exc:
            raise TypeError(
                f"the env factory or policy for worker {w} cannot be pickled for the worker process ({exc}); "
                "pass module-level functions, lambdas or functools.partial objects"
            ) from exc
        return pack_spec(packed, self._init_fn_bytes)

    # -- lifecycle hooks ---------------------------------------------------------------------
    async def _start(self) -> None:
        # TorchRL's default: leave the cores to the workers (restored at shutdown).
        self._saved_threads = torch.get_num_threads()
        torch.set_num_threads(self._mc.num_threads or max(1, self._saved_threads - self._num_workers))

        def build() -> Transport:
            # Off the loop: a transport may open a store or resolve names while it is built.
            # Assigned in the thread, so a cancelled start still closes what was built.
            self._transport = self._transport_class(self._num_workers, self._mc.transport_options, self._weights_layout)
            return self._transport

        transport = await to_thread(build)
        self._weights_started()
        self._pump = Pump(transport, self._on_exit, self._watchdog)
        errors: list[BaseException] = []

        async def start(w: int) -> None:
            try:
                await self._start_worker(w)
            except Exception as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for w in range(self._num_workers):
                tg.start_soon(start, w)
        if errors:
            raise first_failure(errors)

    async def _start_worker(self, w: int) -> None:
        transport, pump = self._transport, self._pump
        assert transport is not None and pump is not None
        version = self._targets[w]  # what its spec says it starts from
        layout = await transport.start(w, self._spec_bytes(w))
        shape = tuple(layout.shape)  # [*env_batch, T]
        self._batch_shapes[w] = shape
        self._layouts[w] = layout
        self._hidden = getattr(layout, "hidden", ())
        if self._direct and layout.pickled:
            raise TypeError(
                f"worker {w}'s batches have no fixed layout (a heterogeneous or dynamic env, or non-tensor "
                "entries), which aiocollect's ReplayBuffer cannot store; give a TorchRL replay buffer (e.g. with "
                "LazyStackStorage) or no buffer"
            )
        if self._direct:
            frames = [(k, s[len(shape) :], d) for k, s, d in layout]
            self._rb.build(frames, shape[-1])
            self._rb.storage.check_layout(frames)
            transport.attach_storage(w, self._rb.storage)
        pump.alive[w] = True
        pump.acked[w] = version
        self._mark_busy(w)
        if self._targets[w] > version:
            # An update came while it started: it may have started from the weights before.
            self._send_weights(w, shared=self._own_weights[w] is None)

    async def _on_exit(self, w: int, exitcode: int | None) -> None:
        transport, pump = self._transport, self._pump
        assert transport is not None and pump is not None
        pid = transport.pid(w)
        await transport.stop(w, self._cfg.shutdown_timeout)
        lost = sorted(self._outstanding[w])
        for slot in lost:  # their rows were never (fully) written
            self._release_slot(w, slot, commit=False)
        if self._restarts_left <= 0 or self._closed:
            pump.failures.append(WorkerCrashedError(w, pid, exitcode))
            return
        # Supervision: a fresh worker, a fresh seed stream, the current weights; the batches
        # it had in flight are dropped (and counted), then asked for again.
        self._restarts_left -= 1
        self._restarts += 1
        self._generation[w] += 1
        self._dropped_batches += len(lost)
        pump.pending[w].clear()
        if self._seed_root is not None:
            self._worker_seeds[w] = self._seed_root.spawn(1)[0]
        await self._start_worker(w)
        await self._redispatch_after_restart(w, lost)

    async def _redispatch_after_restart(self, w: int, lost: list[int]) -> None:
        for slot in lost:
            await self._dispatch(w, slot)

    async def _close_resources(self) -> None:
        if self._transport is not None:
            await self._transport.aclose(self._cfg.shutdown_timeout)
        self._close_now()
        failures = {} if self._transport is None else self._transport.close_failures
        if failures:  # raised as the in-process Collector raises its env's close() error
            raise first_failure([worker_error_from_message(w, pid, f) for w, (pid, f) in sorted(failures.items())])

    def _close_now(self) -> None:
        if self._transport is not None:
            self._transport.close_now()
        for w in range(self._num_workers):  # workers are gone: nothing more will be written
            for slot in list(self._outstanding[w]):
                self._release_slot(w, slot, commit=False)
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None

    def _worker_pids(self) -> list[int | None]:
        """The process id running each worker (``None``: not running)."""
        t = self._transport
        return [None if t is None else t.pid(w) for w in range(self._num_workers)]

    def _activity(self) -> int:
        t = self._transport
        if t is None:
            return self._batches
        counts = (t.progress(w) for w in range(self._num_workers))
        return self._batches + sum(p[0] for p in counts if p is not None)

    def _repr_extra(self) -> str:
        alive = sum(self._pump.alive) if self._pump is not None else 0
        return f"workers: {alive}/{self._num_workers} alive, {self._restarts} restarted"

    # -- liveness ----------------------------------------------------------------------------
    def _mark_busy(self, w: int) -> None:
        assert self._transport is not None
        self._liveness.work_sent(w, self._transport.progress(w))

    def _silent(self) -> list[tuple[int, float, int]]:
        pump = self._pump
        if pump is None:
            return []

        def owed(w: int) -> bool:  # a batch not yet delivered, or a weight acknowledgement
            return len(self._outstanding[w]) > len(pump.pending[w]) or pump.acked[w] < self._targets[w]

        progress = [self._transport.progress(w) for w in range(self._num_workers)]  # type: ignore[union-attr]
        return self._liveness.silent(progress, pump.alive, owed)

    def _watchdog(self) -> float | None:
        """Fail (or restart) stalled workers; return when to check again (``None``: no need)."""
        timeout = self._mc.worker_timeout
        if timeout is None or self._closed:
            return None
        # Progress is noticed when it is looked for, so check a few times per timeout: a
        # worker that stalls is caught between 1 and 1.25 timeouts after its last step.
        next_check = timeout / 4 if any(self._pump.alive) else None  # type: ignore[union-attr]
        for w, seconds, count in self._silent():
            if seconds >= timeout:
                self._on_stall(w, seconds, count)
            else:
                next_check = min(next_check or timeout, timeout - seconds)
        return next_check

    def _on_stall(self, w: int, seconds: float, count: int) -> None:
        pump, transport = self._pump, self._transport
        assert pump is not None and transport is not None
        pid = transport.pid(w)
        if self._restarts_left > 0 and transport.can_kill:
            # The pump then sees the exit and supervision restarts the worker as after any crash.
            self._liveness.forgive(w, count)
            transport.kill(w)
            return
        pump.alive[w] = False
        pump.failures.append(
            WorkerTimeoutError(
                w, pid, count, seconds, self._mc.worker_timeout or 0.0, process_state(pid), self._restart_arg
            )
        )

    def _stalled_workers(self) -> tuple[int, ...]:
        """Workers that owe work and made no progress for 10 s (or half of ``worker_timeout``)."""
        limit = min(STALL_REPORT, (self._mc.worker_timeout or 2 * STALL_REPORT) / 2)
        return tuple(w for w, seconds, _ in self._silent() if seconds >= limit)

    # -- collection --------------------------------------------------------------------------
    def _in_flight(self) -> int:
        return sum(len(o) for o in self._outstanding)

    def _frames_of(self, w: int) -> int:
        return math.prod(self._batch_shapes[w])

    def _send_collect(self, w: int, slot: int, reservation: Any) -> None:
        self._idle[w].remove(slot)
        self._outstanding[w][slot] = reservation
        self._seq += 1
        self._mark_busy(w)
        pieces = None if reservation is None else tuple(reservation.pieces)
        self._transport.send(w, Collect(slot, self._init_random(), self._seq, pieces))  # type: ignore[union-attr]

    async def _dispatch(self, w: int, slot: int) -> None:
        """Ask worker ``w`` for a batch in ``slot`` (waiting for buffer room if needed)."""
        if self._paused:
            return  # stays idle; resumed by _resume_dispatch
        res = await self._rb.reserve(self._frames_of(w), self._batch_shapes[w]) if self._direct else None
        if self._paused and res is not None:  # paused while waiting for room
            self._rb.abort(res)
            return
        self._send_collect(w, slot, res)

    def _dispatch_nowait(self, w: int, slot: int) -> bool:
        if self._paused:
            return False
        res = None
        if self._direct:
            res = self._rb.try_reserve(self._frames_of(w), self._batch_shapes[w])
            if res is None:
                return False
        self._send_collect(w, slot, res)
        return True

    async def _resume_dispatch(self) -> None:
        pass  # each collector class dispatches idle slots when it next collects

    def _release_slot(self, w: int, slot: int, *, commit: bool) -> None:
        res = self._outstanding[w].pop(slot, None)
        if slot not in self._idle[w]:
            self._idle[w].append(slot)
        if res is not None:
            if commit:
                self._rb.commit(res)
            else:
                self._rb.abort(res)

    def _take(self, w: int) -> tuple[int, TensorDictBase]:
        """The slot of worker ``w``'s oldest finished batch, and a TensorDict view of it."""
        assert self._pump is not None
        slot = self._pump.pending[w].popleft()
        payload = self._pump.payloads[w].pop(slot, None)
        if payload is not None:  # a batch with no fixed layout, pickled whole
            batch = pickle.loads(payload)
        else:
            views = self._transport.batch(w, slot)  # type: ignore[union-attr]
            batch = restore_nested(TensorDict(dict(views), batch_size=self._batch_shapes[w]), self._layouts[w])
        self._count_worker(w, batch)
        return slot, batch

    # -- control -----------------------------------------------------------------------------
    def set_seed(self, seed: int) -> int:
        """Give each worker an independent stream from ``SeedSequence(seed).spawn``.

        Workers reset their envs with the new seeds before their next batch. The same seed
        gives the same data from `MultiSyncCollector`, whatever the timing.

        Returns:
            A new seed derived from ``seed``, to seed another collector independently.
        """
        root = np.random.SeedSequence(check_seed(seed))
        self._seed_root = root
        self._worker_seeds = root.spawn(self._num_workers)
        if self._started:
            for w in range(self._num_workers):
                self._transport.send(w, Seed(self._worker_seeds[w]))  # type: ignore[union-attr]
        return int(root.spawn(1)[0].generate_state(1)[0])

    def reset(self) -> None:
        """Reset every worker's envs (with fresh trajectory ids) before its next batch.

        In ``trajs_per_batch`` mode, unfinished and queued trajectories are dropped.
        """
        if self._transport is not None:
            for w in range(self._num_workers):
                self._transport.send(w, Reset())
        if self._traj is not None:
            self._traj.reset()

    def _state_module(self) -> torch.nn.Module | None:
        return self._policy if isinstance(self._policy, torch.nn.Module) else None

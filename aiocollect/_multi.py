"""Multi-process collectors: MultiSyncCollector, MultiAsyncCollector and AsyncCollector.

The parent never touches an env. Each worker runs the same rollout engine as `Collector` in
its own process and writes each batch into one of its two shared-memory slots; the parent
copies a finished slot out (the one copy the caller keeps) and hands the slot back. Pipes
carry only the small commands of ``_workers._worker_main``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import anyio
import anyio.to_thread
import cloudpickle
import numpy as np
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase
from tensordict.nn import InteractionType

from ._config import CollectorConfig, validate_config
from ._errors import CollectorClosedError, WorkerCrashedError
from ._lifecycle import CollectorLifecycle
from ._pump import Pump
from ._seeding import check_seed
from ._shm import SharedBlock, layout_nbytes
from ._workers import get_worker_backend
from ._workers._base import WorkerHandle
from ._workers._worker_main import WorkerConfig

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

__all__ = ["AsyncCollector", "MultiAsyncCollector", "MultiSyncCollector"]

_SLOTS = 2  # double buffering: a worker fills one slot while the parent reads the other


def _per_worker(name: str, value: Any, n: int) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries but there are {n} workers; give one per worker")
        return list(value)
    return [value] * n


class _MultiCollector(CollectorLifecycle):
    _sync: ClassVar[bool]

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        num_workers: int | None = None,
        policy_factory: Callable[[], Any] | Sequence[Callable[[], Any]] | None = None,
        frames_per_batch: int | Sequence[int],
        total_frames: int = -1,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool | None = None,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        reset_when_done: bool = True,
        device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        storing_device: Any = None,
        create_env_kwargs: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
        set_truncated: bool = False,
        track_traj_ids: bool = True,
        cat_results: str | int | None = None,
        update_at_each_batch: bool = False,
        num_threads: int | None = None,
        num_sub_threads: int = 1,
        max_queued_batches: int = 0,
        restart_workers: int = 0,
        weight_sync_timeout: float = 60.0,
        shutdown_timeout: float = 10.0,
        backend: str = "subprocess",
        start_method: str = "spawn",
    ) -> None:
        name = type(self).__name__
        if isinstance(create_env_fn, (list, tuple)):
            fns = list(create_env_fn)
            if num_workers is not None and num_workers != len(fns):
                raise ValueError(f"num_workers={num_workers!r} but create_env_fn lists {len(fns)} factories; drop num_workers")
        else:
            if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
                raise ValueError(f"num_workers must be a positive int when create_env_fn is a single factory, got {num_workers!r}")
            fns = [create_env_fn] * num_workers
        n = len(fns)
        if n == 0:
            raise ValueError("create_env_fn must list at least one env factory, got an empty list")
        if isinstance(frames_per_batch, (list, tuple)):
            fpbs = _per_worker("frames_per_batch", frames_per_batch, n)
            total_fpb = sum(fpbs) if self._sync else fpbs[0]
        else:
            total_fpb = frames_per_batch
            valid = isinstance(frames_per_batch, int) and not isinstance(frames_per_batch, bool) and frames_per_batch > 0
            # An invalid value is passed through unchanged so validate_config reports it.
            share = math.ceil(frames_per_batch / n) if valid and self._sync else frames_per_batch
            fpbs = [share] * n
        factories = _per_worker("policy_factory", policy_factory, n)
        for f in factories:
            if f is not None and not callable(f):
                raise TypeError(f"policy_factory must be a zero-argument callable (or one per worker), got {f!r}")
        common = dict(
            policy=policy, max_frames_per_traj=max_frames_per_traj, init_random_frames=init_random_frames,
            reset_at_each_iter=reset_at_each_iter, exploration_type=exploration_type,
            reset_when_done=reset_when_done, set_truncated=set_truncated, track_traj_ids=track_traj_ids,
            shutdown_timeout=shutdown_timeout,
        )  # fmt: skip
        self._cfg = validate_config(
            create_env_fn=fns[0], frames_per_batch=total_fpb, total_frames=total_frames, postproc=postproc,
            split_trajs=split_trajs, device=device, env_device=None, policy_device=None, storing_device=storing_device,
            create_env_kwargs=None, max_queued_batches=max_queued_batches, **common,
        )  # fmt: skip
        devs = [_per_worker(k, v, n) for k, v in (("env_device", env_device), ("policy_device", policy_device))]
        kwargs = _per_worker("create_env_kwargs", create_env_kwargs, n)
        self._worker_cfgs: list[CollectorConfig] = [
            dataclasses.replace(
                validate_config(
                    create_env_fn=fns[w], frames_per_batch=fpbs[w], total_frames=-1, postproc=None, split_trajs=False,
                    device=device, env_device=devs[0][w], policy_device=devs[1][w], storing_device=None,
                    create_env_kwargs=kwargs[w], max_queued_batches=0, **common,
                ),
                storing_device=None,
            )
            for w in range(n)
        ]  # fmt: skip
        if self._sync:
            cat_results = "stack" if cat_results is None else cat_results
            if cat_results != "stack" and (isinstance(cat_results, bool) or not isinstance(cat_results, int)):
                raise ValueError(f"cat_results must be 'stack' or an int dim, got {cat_results!r}")
        elif cat_results is not None:
            raise ValueError(f"cat_results is only for MultiSyncCollector ({name} yields one worker's batch), got {cat_results!r}")
        self._cat = cat_results
        for arg, value in (("update_at_each_batch", update_at_each_batch),):
            if not isinstance(value, bool):
                raise TypeError(f"{arg} must be a bool, got {value!r}")
        if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be a positive int or None, got {num_threads!r}")
        if isinstance(num_sub_threads, bool) or not isinstance(num_sub_threads, int) or num_sub_threads < 1:
            raise ValueError(f"num_sub_threads must be a positive int, got {num_sub_threads!r}")
        if isinstance(restart_workers, bool) or not isinstance(restart_workers, int) or restart_workers < 0:
            raise ValueError(f"restart_workers must be an int >= 0, got {restart_workers!r}")
        if isinstance(weight_sync_timeout, bool) or not isinstance(weight_sync_timeout, (int, float)) or weight_sync_timeout <= 0:
            raise ValueError(f"weight_sync_timeout must be a positive number of seconds, got {weight_sync_timeout!r}")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver' (fork is unsafe with threads), got {start_method!r}")
        self._backend = get_worker_backend(backend)
        self._start_method = start_method
        self._policy = policy
        self._factories = factories
        self._update_at_each_batch = update_at_each_batch
        self._num_threads = num_threads
        self._num_sub_threads = num_sub_threads
        self._restarts_left = restart_workers
        self._weight_sync_timeout = float(weight_sync_timeout)
        self._num_workers = n
        self._version = 0
        self._restarts = 0
        self._dropped_batches = 0
        self._generation = [0] * n
        self._seed_root: np.random.SeedSequence | None = None
        self._worker_seeds: list[Any] = [None] * n
        self._weights, self._weights_layout, self._weight_views = self._make_weight_block(policy)
        self._workers: list[WorkerHandle] = []
        self._slots: list[list[dict[Any, torch.Tensor]]] = [[] for _ in range(n)]
        self._outstanding: list[set[int]] = [set() for _ in range(n)]
        self._saved_threads: int | None = None
        self._pump: Pump | None = None
        self._update_lock: anyio.Lock | None = None
        for w in range(n):  # fail on unpicklable factories now, before anything is spawned
            self._config_bytes(w)
        self._init_lifecycle(self._cfg.total_frames, total_fpb, self._cfg.max_queued_batches)

    # -- configuration -----------------------------------------------------------------------
    @staticmethod
    def _make_weight_block(policy: Any) -> tuple[SharedBlock | None, Any, dict[str, torch.Tensor]]:
        if not isinstance(policy, torch.nn.Module):
            return None, None, {}
        state = policy.state_dict()
        layout = [(k, tuple(v.shape), v.dtype) for k, v in state.items()]
        block = SharedBlock(layout_nbytes(layout))
        views = block.views(layout)
        with torch.no_grad():
            for k, v in state.items():
                views[k].copy_(v)
        return block, layout, views

    def _config_bytes(self, w: int) -> bytes:
        cfg = WorkerConfig(
            worker_id=w, num_workers=self._num_workers, collector=self._worker_cfgs[w],
            policy=None if self._factories[w] is not None else self._policy, policy_factory=self._factories[w],
            num_sub_threads=self._num_sub_threads, weights_layout=self._weights_layout,
            policy_version=self._version, seed=self._worker_seeds[w],
            traj_start=w + self._num_workers * (self._generation[w] << 40),
        )  # fmt: skip
        try:
            return cloudpickle.dumps(cfg)
        except Exception as exc:
            raise TypeError(
                f"the env factory or policy for worker {w} cannot be pickled for the worker process ({exc}); "
                "pass module-level functions, lambdas or functools.partial objects"
            ) from exc

    # -- lifecycle hooks ---------------------------------------------------------------------
    async def _start(self) -> None:
        # TorchRL's default: leave the cores to the workers (restored at shutdown).
        self._saved_threads = torch.get_num_threads()
        threads = self._num_threads or max(1, self._saved_threads - self._num_workers)
        torch.set_num_threads(threads)
        self._update_lock = anyio.Lock()
        self._workers = [self._backend(w, self._start_method) for w in range(self._num_workers)]
        self._pump = Pump(self._workers, self._on_exit)
        errors: list[BaseException] = []

        async def start(w: int) -> None:
            try:
                await self._start_worker(w)
            except Exception as exc:  # noqa: BLE001 - collected and raised below
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for w in range(self._num_workers):
                tg.start_soon(start, w)
        if errors:
            if len(errors) == 1:
                raise errors[0]
            raise BaseExceptionGroup("several workers failed to start", errors)

    async def _start_worker(self, w: int) -> None:
        from ._errors import worker_error_from_message

        handle = self._workers[w]
        await handle.start(self._config_bytes(w), self._weights)
        for expected in ("layout", "ready"):
            msg = await handle.receive()
            if msg[0] == "error":
                raise worker_error_from_message(w, handle.pid, msg)
            if msg[0] == "exited":
                raise WorkerCrashedError(w, handle.pid, msg[1], during_startup=True)
            if msg[0] != expected:
                raise RuntimeError(f"worker {w} sent {msg[0]!r} during startup, expected {expected!r}")
            if expected == "layout":
                layout = msg[1]
                slot_bytes = layout_nbytes(layout)
                block = SharedBlock(_SLOTS * slot_bytes)
                handle.send(("slots", _SLOTS, slot_bytes))
                handle.send_block(block)
                block.close_fd()
                self._slots[w] = [block.views(layout, i * slot_bytes) for i in range(_SLOTS)]
        assert self._pump is not None
        self._pump.alive[w] = True
        self._pump.acked[w] = self._version

    async def _on_exit(self, w: int, exitcode: int | None) -> None:
        assert self._pump is not None
        pid = self._workers[w].pid
        await self._workers[w].stop(self._cfg.shutdown_timeout)
        if self._restarts_left <= 0 or self._closed:
            self._pump.failures.append(WorkerCrashedError(w, pid, exitcode))
            return
        # Supervision: a fresh process, a fresh seed stream, the current weights; the batches
        # it had in flight are dropped (and counted), then asked for again.
        self._restarts_left -= 1
        self._restarts += 1
        self._generation[w] += 1
        lost = self._outstanding[w]
        self._dropped_batches += len(lost)
        self._pump.pending[w].clear()
        if self._seed_root is not None:
            self._worker_seeds[w] = self._seed_root.spawn(1)[0]
        self._workers[w] = self._backend(w, self._start_method)
        self._pump.workers[w] = self._workers[w]
        await self._start_worker(w)
        for slot in sorted(lost):
            self._workers[w].send(("collect", slot, self._random()))

    async def _close_resources(self) -> None:
        timeout = self._cfg.shutdown_timeout
        with anyio.move_on_after(timeout * 3):
            async with anyio.create_task_group() as tg:
                for handle in self._workers:
                    tg.start_soon(handle.stop, timeout)
        self._close_now()

    def _close_now(self) -> None:
        for handle in self._workers:
            handle.kill_now()
        if self._weights is not None:
            self._weights.close_fd()
        # Dropping the views unmaps the blocks (each mapping holds a descriptor until then).
        self._slots = [[] for _ in range(self._num_workers)]
        self._weights, self._weight_views = None, {}
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None

    def _policy_version(self) -> int:
        return self._version

    def _repr_extra(self) -> str:
        alive = sum(self._pump.alive) if self._pump is not None else 0
        return f"workers: {alive}/{self._num_workers} alive, {self._restarts} restarted"

    # -- collection --------------------------------------------------------------------------
    def _random(self) -> bool:
        return self._frames < self._cfg.init_random_frames

    def _dispatch(self, w: int, slot: int) -> None:
        self._outstanding[w].add(slot)
        self._workers[w].send(("collect", slot, self._random()))

    def _take(self, w: int) -> TensorDictBase:
        assert self._pump is not None
        slot = self._pump.pending[w].popleft()
        self._outstanding[w].discard(slot)
        views = self._slots[w][slot]
        shape = views[("collector", "worker_id")].shape
        return TensorDict(views, batch_size=shape), slot  # type: ignore[return-value]

    def _post(self, batch: TensorDictBase) -> TensorDictBase:
        if self._cfg.storing_device is not None:
            batch = batch.to(self._cfg.storing_device)
        if self._cfg.split_trajs:
            from ._split import split_trajectories

            batch = split_trajectories(batch, prefix="collector")
        if self._cfg.postproc is not None:
            batch = self._cfg.postproc(batch)
        return batch

    async def _finish(self, batch: TensorDictBase, start: float) -> TensorDictBase:
        self._count(batch.numel(), time.perf_counter() - start)
        if self._cfg.split_trajs or self._cfg.postproc is not None or self._cfg.storing_device is not None:
            batch = await anyio.to_thread.run_sync(self._post, batch)
        return batch

    # -- control -----------------------------------------------------------------------------
    async def update_policy_weights_(self, policy_or_weights: Any = None, *, weights: Any = None) -> None:
        """Copy new weights into shared memory and wait until every live worker applied them.

        Workers apply weights between batches, so no batch mixes two versions. Each frame
        records the version it was collected with in ``("collector", "policy_version")``.

        Args:
            policy_or_weights: An ``nn.Module``, a state dict or a TensorDict of weights;
                ``None`` reads the ``policy`` passed to the constructor.
            weights: Same as ``policy_or_weights`` (TorchRL's keyword).

        Raises:
            TypeError: The collector has no ``nn.Module`` policy to take the weight layout from.
            TimeoutError: Some workers did not acknowledge within ``weight_sync_timeout``
                (the message names them).
        """
        if self._closed:
            raise CollectorClosedError(f"this {type(self).__name__} was shut down; create a new one")
        if self._weights is None:
            raise TypeError(
                "update_policy_weights_() needs an nn.Module policy= to define the shared weights; "
                "pass policy= (it may be given together with policy_factory)"
            )
        if policy_or_weights is not None and weights is not None:
            raise ValueError("pass weights either positionally or as weights=, not both")
        source = weights if weights is not None else policy_or_weights
        source = self._policy if source is None else source
        if isinstance(source, torch.nn.Module):
            state = source.state_dict()
        elif isinstance(source, TensorDictBase):
            state = source.flatten_keys(".").to_dict()
        else:
            state = dict(source)
        missing = set(self._weight_views) - set(state)
        if missing:
            raise KeyError(f"weights are missing entries {sorted(missing)}; pass the policy's full state dict")
        lock = self._update_lock or anyio.Lock()
        async with lock:
            await anyio.to_thread.run_sync(self._copy_weights, state)
            self._version += 1
            if not self._started or self._pump is None:
                return
            pump, version = self._pump, self._version
            live = [w for w in range(self._num_workers) if pump.alive[w]]
            for w in live:
                self._workers[w].send(("weights", version))
            with anyio.move_on_after(self._weight_sync_timeout):
                await pump.until(lambda: all(pump.acked[w] >= version or not pump.alive[w] for w in live))
                return
            late = [w for w in live if pump.acked[w] < version and pump.alive[w]]
            raise TimeoutError(
                f"workers {late} did not apply policy version {version} within weight_sync_timeout="
                f"{self._weight_sync_timeout}s; raise weight_sync_timeout or make batches shorter"
            )

    def _copy_weights(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for k, view in self._weight_views.items():
                view.copy_(state[k])

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
            for w, handle in enumerate(self._workers):
                handle.send(("seed", self._worker_seeds[w]))
        return int(root.spawn(1)[0].generate_state(1)[0])

    def reset(self) -> None:
        """Reset every worker's envs (with fresh trajectory ids) before its next batch."""
        for handle in self._workers:
            handle.send(("reset",))

    def state_dict(self) -> dict[str, Any]:
        """Return counters, the policy version and the policy's weights."""
        pol = self._policy
        return {
            "policy_state_dict": pol.state_dict() if isinstance(pol, torch.nn.Module) else None,
            "frames": self._frames,
            "batches": self._batches,
            "policy_version": self._version,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore counters and weights from `state_dict` (weights reach workers on the next update)."""
        pol = self._policy
        if state_dict.get("policy_state_dict") is not None and isinstance(pol, torch.nn.Module):
            pol.load_state_dict(state_dict["policy_state_dict"])
            self._copy_weights(state_dict["policy_state_dict"])
        self._frames = int(state_dict["frames"])
        self._batches = int(state_dict["batches"])
        self._version = int(state_dict["policy_version"])

    def stats(self) -> Any:
        """Return a `CollectorStats` snapshot, with worker restarts and dropped batches."""
        base = super().stats()
        alive = sum(self._pump.alive) if self._pump is not None else 0
        return dataclasses.replace(
            base, workers=self._num_workers, workers_alive=alive, restarts=self._restarts,
            dropped_batches=self._dropped_batches,
        )  # fmt: skip


class MultiSyncCollector(_MultiCollector):
    """Collect in worker processes and deliver every worker's batch together, in worker order.

    ``frames_per_batch`` is split across workers (``ceil(fpb / num_workers)`` each, or one
    entry per worker). With ``cat_results="stack"`` (default) batches have shape
    ``[num_workers, *env_batch, T]``; an int concatenates along that dim instead. Workers
    collect on demand, after any weight update, so on-policy training sees fresh weights.

    Examples:
        >>> import anyio
        >>> from aiocollect import MultiSyncCollector
        >>> async def main():
        ...     async with MultiSyncCollector("CartPole-v1", num_workers=2, frames_per_batch=64,
        ...                                   total_frames=128) as c:
        ...         return [b.shape async for b in c]
        >>> anyio.run(main)  # doctest: +SKIP
        [torch.Size([2, 32]), torch.Size([2, 32])]
    """

    _sync = True

    async def _collect_one(self) -> TensorDictBase:
        await self._ensure_started()
        if self._update_at_each_batch:
            await self.update_policy_weights_()
        assert self._pump is not None
        pump, n = self._pump, self._num_workers
        slot = self._batches % _SLOTS
        start = time.perf_counter()
        for w in range(n):
            self._dispatch(w, slot)
        await pump.until(lambda: all(pump.pending[w] for w in range(n)))
        parts = [self._take(w)[0] for w in range(n)]
        batch = await anyio.to_thread.run_sync(self._assemble, parts)
        return await self._finish(batch, start)

    def _assemble(self, parts: list[TensorDictBase]) -> TensorDictBase:
        nb = parts[0].ndim
        if self._cat == "stack":
            if all(p.shape == parts[0].shape for p in parts):
                out = torch.stack(parts, 0)  # a dense copy: the slots are free again after this
            else:
                out = LazyStackedTensorDict.lazy_stack([p.clone() for p in parts], 0)
            names = [None] * nb + ["time"]
        else:
            out = torch.cat(parts, int(self._cat))
            names = [None] * (nb - 1) + ["time"]  # time stays the last dim whichever dim is joined
        if names is not None and not isinstance(out, LazyStackedTensorDict):
            out.refine_names(*names)
        return out


class MultiAsyncCollector(_MultiCollector):
    """Collect in worker processes and deliver each worker's batch as soon as it is ready.

    Every batch comes from one worker and has the full ``frames_per_batch`` (shape
    ``[*env_batch, T]``). Workers keep collecting (two batches ahead each) while you train,
    so the policy may lag by a version: suited to off-policy learning. Each frame records its
    ``("collector", "worker_id")`` and ``("collector", "policy_version")``.

    Examples:
        >>> import anyio
        >>> from aiocollect import MultiAsyncCollector
        >>> async def main():
        ...     async with MultiAsyncCollector("CartPole-v1", num_workers=2, frames_per_batch=32,
        ...                                    total_frames=64) as c:
        ...         return [b.shape async for b in c]
        >>> anyio.run(main)  # doctest: +SKIP
        [torch.Size([32]), torch.Size([32])]
    """

    _sync = False

    async def _start(self) -> None:
        await super()._start()
        for w in range(self._num_workers):
            for slot in range(_SLOTS):
                self._dispatch(w, slot)

    async def _collect_one(self) -> TensorDictBase:
        await self._ensure_started()
        assert self._pump is not None
        pump = self._pump
        start = time.perf_counter()
        await pump.until(lambda: any(pump.pending))
        w = next(i for i, p in enumerate(pump.pending) if p)
        view, slot = self._take(w)
        batch = await anyio.to_thread.run_sync(view.clone)
        batch.refine_names(*([None] * (batch.ndim - 1)), "time")
        if self._update_at_each_batch:
            await self.update_policy_weights_()
        self._dispatch(w, slot)  # the slot is free again: the worker may refill it
        return await self._finish(batch, start)


class AsyncCollector(MultiAsyncCollector):
    """One collector in one background process, collecting ahead while you train.

    Takes a single ``create_env_fn`` and the arguments of `MultiAsyncCollector` (without
    ``num_workers``). TorchRL's ``aSyncDataCollector`` semantics.

    Examples:
        >>> import anyio
        >>> from aiocollect import AsyncCollector
        >>> async def main():
        ...     async with AsyncCollector("CartPole-v1", frames_per_batch=32, total_frames=64) as c:
        ...         return [b.shape async for b in c]
        >>> anyio.run(main)  # doctest: +SKIP
        [torch.Size([32]), torch.Size([32])]
    """

    def __init__(self, create_env_fn: Any, policy: Any = None, **kwargs: Any) -> None:
        if "num_workers" in kwargs:
            raise TypeError("AsyncCollector runs exactly one worker; use MultiAsyncCollector for num_workers")
        if isinstance(create_env_fn, (list, tuple)):
            raise TypeError("AsyncCollector takes a single create_env_fn, not a list; use MultiAsyncCollector")
        super().__init__(create_env_fn, policy, num_workers=1, **kwargs)

"""Multi-process collectors: MultiSyncCollector, MultiAsyncCollector and AsyncCollector.

The machinery (workers, shared slots, weights, supervision) is in ``_multi._engine``; this
module holds the constructor they share and the two delivery policies: every worker's batch
together, in worker order (sync), or whichever worker finishes first (async).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from .._collect._weight_sync import WeightUpdates
from .._core._public import fill_args
from .._core._ragged import frame_count
from .._core._threads import to_thread
from ._config import collector_options, multi_signature, resolve_multi_config
from ._engine import MultiCollectorBase

__all__ = ["AsyncCollector", "MultiAsyncCollector", "MultiSyncCollector"]

_POLICY_VERSION = ("collector", "policy_version")


class _MultiCollector(WeightUpdates, MultiCollectorBase):
    _sync: bool

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        num_workers: int | None = None,
        policy_factory: Callable[[], Any] | Sequence[Callable[[], Any]] | None = None,
        cat_results: str | int | None = None,
        update_at_each_batch: bool = False,
        preemptive_threshold: float | None = None,
        num_threads: int | None = None,
        num_sub_threads: int = 1,
        restart_workers: int = 0,
        weight_sync_timeout: float = 60.0,
        worker_timeout: float | None = 300.0,
        backend: str = "subprocess",
        start_method: str | None = None,
        collector_class: Any = None,
        init_fn: Callable[[], Any] | None = None,
        **options: Any,
    ) -> None:
        # Every other argument is `Collector`'s, with its defaults: its signature is the one
        # place they are declared (see `collector_options`).
        opts = collector_options(type(self).__name__, options)
        traj_args = {k: opts.pop(k) for k in ("extend_buffer", "trajs_per_batch", "traj_format", "trajs_per_write")}
        replay_buffer = opts.pop("replay_buffer")
        hooks = {k: opts.pop(k) for k in ("pre_collect_hook", "post_collect_hook")}
        if opts.pop("worker_idx") is not None:
            raise TypeError(f"{type(self).__name__} numbers its workers itself (0 to num_workers - 1); drop worker_idx")
        mc = resolve_multi_config(
            sync=self._sync, create_env_fn=create_env_fn, num_workers=num_workers, policy=policy,
            policy_factory=policy_factory, cat_results=cat_results, update_at_each_batch=update_at_each_batch,
            preemptive_threshold=preemptive_threshold, num_threads=num_threads, num_sub_threads=num_sub_threads,
            restart_workers=restart_workers, weight_sync_timeout=weight_sync_timeout, worker_timeout=worker_timeout,
            start_method=start_method, backend=backend, collector_class=collector_class, init_fn=init_fn, **opts,
        )  # fmt: skip
        self._init_multi(mc, policy, replay_buffer, **traj_args)
        for name, hook in hooks.items():  # checked (callable, picklable) before any worker exists
            setattr(self, name, hook)

    def frames_per_batch_worker(self, *, worker_idx: int | None = None) -> int:
        """Frames each worker is asked for per batch (TorchRL's method).

        `MultiSyncCollector` splits ``frames_per_batch`` across its workers: each is asked for
        ``ceil(frames_per_batch / num_workers)``, or its own entry of a per-worker list. A
        `MultiAsyncCollector` (and `AsyncCollector`) asks every worker for a whole batch. A
        worker rounds what it is asked for up to a multiple of its env batch, as `Collector`
        does.

        Args:
            worker_idx: A worker's index, ``0`` to ``num_workers - 1``; ``None``: the even
                split (TorchRL's answer without an index, a list's entries notwithstanding).

        Raises:
            ValueError: ``worker_idx`` is not a worker's index.
        """
        n = self._num_workers
        if worker_idx is None:
            return math.ceil(self._mc.total_fpb / n) if self._sync else self._mc.total_fpb
        if isinstance(worker_idx, bool) or not isinstance(worker_idx, int) or not 0 <= worker_idx < n:
            raise ValueError(f"worker_idx must be an int from 0 to {n - 1} (the workers' indices), got {worker_idx!r}")
        return int(self._mc.worker_cfgs[worker_idx].frames_per_batch)

    def _extra_state(self) -> dict[str, Any]:
        return self._worker_states()  # TorchRL's "worker<i>" entries: each worker's version and weights

    def _load_extra_state(self, state_dict: dict[str, Any]) -> None:
        self._restore_workers(state_dict)


# help(), inspect.signature and IDEs that read __signature__ list every argument.
# worker_idx is the in-process Collector's own: a multi-worker collector numbers its workers.
_multi_sig = multi_signature(_MultiCollector.__init__)
_MultiCollector.__init__.__signature__ = _multi_sig.replace(  # type: ignore[attr-defined]
    parameters=[p for name, p in _multi_sig.parameters.items() if name != "worker_idx"]
)


_ARGS_DOC = """
    Args:
        create_env_fn: One env factory (with ``num_workers``) or a list of them, one per
            worker; anything `Collector` accepts, picklable (lambdas are fine).
        policy: ``None``, an ``nn.Module`` or a TensorDict callable, sent to every worker.
            An ``nn.Module`` also defines the shared weights `update_policy_weights_` syncs.
        num_workers: Worker processes (when ``create_env_fn`` is a single factory).
        policy_factory: Builds the policy inside each worker (one, or one per worker).
        frames_per_batch: Frames per batch; an int or one per worker (`MultiSyncCollector`:
            each worker collects its entry; `MultiAsyncCollector`: every batch has the list's
            sum, as in TorchRL). Unequal entries give `MultiSyncCollector` parts of unequal
            shapes, stacked lazily as in TorchRL (a ``LazyStackedTensorDict`` of batch size
            ``[num_workers, *env_batch, -1]``), whose every frame counts and is stored.
        cat_results: ``"stack"`` (default) or a dim to concatenate worker batches along
            (`MultiSyncCollector` only; `MultiAsyncCollector` takes ``None`` or ``"stack"``,
            TorchRL's default, and yields each worker's batch whole).
        update_at_each_batch: Call `update_policy_weights_` before each batch.
        preemptive_threshold: `MultiSyncCollector` only: once this fraction of workers has
            delivered, the others stop early (after at least one step; ``0.0`` stops every
            worker after its first); their missing steps have trajectory id and policy
            version ``-1`` and are not counted (nor stored in a replay buffer), and a
            concatenated batch (``cat_results`` a dim) leaves them out.
        num_threads: Torch threads of this process while workers run (default: the cores
            left after one per worker).
        num_sub_threads: Torch threads per worker.
        replay_buffer: A `ReplayBuffer`: workers write batches straight into its storage
            (made shared if it is not built yet) and iteration yields ``None`` per batch. A
            TorchRL buffer gets one ``extend`` per worker batch, in worker order, as TorchRL's
            workers write it.
        restart_workers: How many crashed workers to restart (re-seeded, re-synced) before
            a crash is raised as `WorkerCrashedError`.
        weight_sync_timeout: Seconds `update_policy_weights_` waits for acknowledgements.
        weight_sync_schemes: TorchRL's ``{"policy": scheme}``: ``SharedMemWeightSyncScheme`` and
            ``MultiProcessWeightSyncScheme`` reach every worker, parameters and buffers, each
            acknowledged (with ``sync=False``, not waited for); ``NoWeightSyncScheme`` ignores
            updates; other schemes raise ``NotImplementedError``.
        weight_updater: Not supported (``NotImplementedError``): TorchRL's ``WeightUpdaterBase``
            pushes through TorchRL's own worker pipes; `update_policy_weights_` syncs every worker.
        weight_recv_schemes: ``None`` only (``NotImplementedError`` otherwise): the workers take
            weights from `update_policy_weights_`, not from a parent process.
        worker_timeout: Seconds a busy worker may go without progress (an env step or a
            command handled) before it counts as hung: `WorkerTimeoutError` names it, or
            with ``restart_workers`` it is killed and restarted. Detected within 1.25x this
            time. ``None`` disables the check; `stats` lists stalled workers either way.
        shutdown_timeout: Seconds each worker gets to exit before it is terminated, then killed.
        backend: Where workers run: ``"subprocess"`` (default: local processes) or
            ``"inline"`` (threads of this process; for tests and debugging).
        start_method: With ``backend="subprocess"``: ``"forkserver"`` (the default on Linux:
            every collector after the first starts its workers in a fraction of a second)
            or ``"spawn"``.
        collector_class: TorchRL's: what each worker runs. Only ``None`` or `Collector`
            (aiocollect's or TorchRL's, the default) is taken; a subclass or a multi-process
            class raises ``TypeError``/``ValueError`` at construction.
        init_fn: Called with no arguments first in each worker (and in each restarted one),
            before its env factory and policy are even unpickled: process-level set-up such
            as a simulator's app launcher (TorchRL's ``init_fn``). Picklable; an exception in
            it fails start-up as `WorkerError` with the worker's id and traceback. With
            ``backend="inline"`` it runs in each worker's thread of this process.
        **others: Every other argument has `Collector`'s meaning; device arguments and
            ``create_env_kwargs`` may be lists with one entry per worker.
"""


class MultiSyncCollector(_MultiCollector):
    """Collect in worker processes and deliver every worker's batch together, in worker order.

    ``frames_per_batch`` is split across workers (``ceil(fpb / num_workers)`` each, or one
    entry per worker). With ``cat_results="stack"`` (default) batches have shape
    ``[num_workers, *env_batch, T]``; an int concatenates along that dim instead. Workers
    collect on demand, after any weight update, so on-policy training sees fresh weights.
    {args}
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

    async def _collect_one(self) -> TensorDictBase | None:
        await self._ensure_started()
        if self._mc.update_at_each_batch:
            await self.update_policy_weights_()
        assert self._pump is not None
        pump, n = self._pump, self._num_workers
        start = time.perf_counter()
        reservations: list[Any] = [None] * n
        if self._direct:
            requests = [(self._frames_of(w), self._batch_shapes[w]) for w in range(n)]
            reservations = await self._rb.reserve_many(requests)
            if self._paused:  # paused while waiting for room: hold nothing, write nothing
                for res in reservations:
                    self._rb.abort(res)
                return None
        seqs = []
        for w in range(n):
            self._send_collect(w, self._idle[w][0], reservations[w])
            seqs.append(self._seq)
        p = self._mc.preemptive_threshold
        if p is not None:
            quorum = int(n * p)  # 0 (TorchRL's "stop after one step"): every worker is cut short at once
            await pump.until(lambda: sum(1 for q in pump.pending if q) >= quorum)
            for w in range(n):
                if not pump.pending[w]:
                    self._transport.preempt(w, seqs[w])  # type: ignore[union-attr]  # cut short at its next step
        await pump.until(lambda: all(pump.pending[w] for w in range(n)))
        taken = [self._take(w) for w in range(n)]
        if self._direct:
            frames = 0
            for w, (slot, _) in enumerate(taken):
                res = self._outstanding[w].pop(slot)
                self._idle[w].append(slot)
                frames += self._rb.commit(res, drop_unfilled=p is not None)
            self._count(frames, time.perf_counter() - start)
            return None
        if self._torchrl_rb is not None:
            # TorchRL's workers each extend the buffer with their own batch: never one stacked entry.
            parts = await to_thread(self._worker_parts, [view for _, view in taken])
            for w, (slot, _) in enumerate(taken):
                self._release_slot(w, slot, commit=False)
            frames = sum(p.batch_size.numel() for p in parts)
            await self._deliver_parts(parts, frames, start, post=self._post_in_parent)
            return None
        batch = await to_thread(self._assemble, [view for _, view in taken])
        for w, (slot, _) in enumerate(taken):
            self._release_slot(w, slot, commit=False)
        frames = frame_count(batch, taken_only=p is not None)
        return await self._deliver(batch, frames, start, post=self._post_in_parent)

    def _worker_parts(self, views: list[TensorDictBase]) -> list[TensorDictBase]:
        """A copy of each worker's batch, without the steps a preempted worker did not take."""
        parts = []
        for view in views:
            part = view.clone()  # the slot is refilled by the worker's next batch
            if self._mc.preemptive_threshold is not None:
                # A preempted worker stops all its envs at the same step: its taken steps come first.
                version = part.get(_POLICY_VERSION)
                part = part[..., : int((version.reshape(-1, version.shape[-1])[0] >= 0).sum())]
            if part.batch_size.numel():
                parts.append(part)
        return parts

    def _assemble(self, parts: list[TensorDictBase]) -> TensorDictBase:
        nb = parts[0].ndim
        out: TensorDictBase  # torch.stack/cat of TensorDicts give a TensorDict (__torch_function__)
        if self._mc.cat == "stack":
            if all(p.shape == parts[0].shape for p in parts):
                out = torch.stack(parts, 0)  # a dense copy: the slots are free again after this
            else:
                out = LazyStackedTensorDict.lazy_stack([p.clone() for p in parts], 0)
            names = [None] * nb + ["time"]
        else:
            dim = int(self._mc.cat)  # type: ignore[arg-type]
            _check_joinable(parts, dim)
            out = torch.cat(parts, dim)
            if self._mc.preemptive_threshold is not None:
                # As TorchRL's: a concatenated batch holds only the steps taken (not the -1 padding),
                # where the parts can be joined without it (their other dims match).
                try:
                    out = torch.cat(self._worker_parts(parts), dim)
                except RuntimeError:
                    pass
            names = [None] * (nb - 1) + ["time"]  # time stays the last dim whichever dim is joined
        if isinstance(out, LazyStackedTensorDict):
            out.names = names  # a lazy stack keeps its parts' names; the stacked dim has none
        else:
            out.refine_names(*names)
        return out


def _check_joinable(parts: list[TensorDictBase], dim: int) -> None:
    """Raise, naming the fix, where the workers' batches cannot be concatenated along ``dim``."""
    shapes = [list(p.shape) for p in parts]
    nd = len(shapes[0])
    if not -nd <= dim < nd:
        raise ValueError(
            f"cat_results={dim} is not a dim of the workers' batches (shape {shapes[0]}: dims {-nd} to {nd - 1}); "
            "use cat_results=-1 (the time dim), 0, or 'stack'"
        )
    d = dim % nd
    if any(s[:d] + s[d + 1 :] != shapes[0][:d] + shapes[0][d + 1 :] for s in shapes):
        raise ValueError(
            f"cat_results={dim} concatenates the workers' batches along dim {dim}, which needs their other dims to "
            f"match, got shapes {', '.join(str(s) for s in shapes)} (workers asked for different frames_per_batch, "
            "or envs with different batch sizes): use cat_results=-1 (the time dim) or 'stack'"
        )


class MultiAsyncCollector(_MultiCollector):
    """Collect in worker processes and deliver each worker's batch as soon as it is ready.

    Every batch comes from one worker and has the full ``frames_per_batch`` (shape
    ``[*env_batch, T]``). Workers keep collecting (two batches ahead each) while you train,
    so batches may come from weights older than the latest update: the ones each worker had
    finished or started when `update_policy_weights_` was called (one per worker if you keep
    up with them, as in TorchRL; two if both of a worker's batches were waiting for you). A
    batch queued but not started is collected with the new weights: the update overtakes it.
    That suits off-policy learning. Each frame records its ``("collector", "worker_id")`` and
    ``("collector", "policy_version")``.
    {args}
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
    _next_worker = 0

    async def _start(self) -> None:
        await super()._start()
        self._dispatch_idle_nowait()  # workers start on their first batches at once

    def _dispatch_idle_nowait(self) -> None:
        assert self._pump is not None
        for w in range(self._num_workers):
            if self._pump.alive[w]:
                for slot in list(self._idle[w]):
                    if not self._dispatch_nowait(w, slot):
                        return  # the buffer says wait: try again after the next batch

    async def _collect_one(self) -> TensorDictBase | None:
        await self._ensure_started()
        assert self._pump is not None
        pump, n = self._pump, self._num_workers
        start = time.perf_counter()
        self._dispatch_idle_nowait()
        if self._in_flight() == 0:
            # Nothing is being collected (the buffer's rate limiter held every slot back):
            # wait for room for one batch. Nothing of ours is in flight, so this cannot deadlock.
            w = next(w for w in range(n) if pump.alive[w] and self._idle[w])
            await self._dispatch(w, self._idle[w][0])
            if self._in_flight() == 0:
                return None  # paused while waiting for room: nothing was asked of any worker
        await pump.until(lambda: any(pump.pending))
        order = [(self._next_worker + i) % n for i in range(n)]  # round robin: no worker starves
        w = next(i for i in order if pump.pending[i])
        self._next_worker = (w + 1) % n
        slot, view = self._take(w)
        if self._direct:
            res = self._outstanding[w].pop(slot)
            self._idle[w].append(slot)
            frames = self._rb.commit(res)
            batch: TensorDictBase | None = None
        else:
            copy = await to_thread(view.clone)
            copy.refine_names(*([None] * (copy.ndim - 1)), "time")
            self._release_slot(w, slot, commit=False)
            frames = copy.numel()
            batch = copy
        if self._mc.update_at_each_batch:
            await self.update_policy_weights_()
        self._dispatch_idle_nowait()  # the slot is free again: the worker may refill it
        if batch is None:
            self._count(frames, time.perf_counter() - start)
            return None
        return await self._deliver(batch, frames, start, post=self._post_in_parent)


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


for _cls in (MultiSyncCollector, MultiAsyncCollector):
    fill_args(_cls, _ARGS_DOC)

# AsyncCollector takes MultiAsyncCollector's arguments less num_workers: say so to help() and IDEs.
_sig = inspect.signature(_MultiCollector.__init__)
AsyncCollector.__init__.__signature__ = _sig.replace(  # type: ignore[attr-defined]
    parameters=[p for name, p in _sig.parameters.items() if name != "num_workers"]
)

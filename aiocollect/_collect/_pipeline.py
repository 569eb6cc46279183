"""The batch pipeline every collector shares, whoever stepped the envs.

After a batch is collected (by this process's rollout or by a worker), the same things happen
to it: it moves to ``storing_device``, is split into trajectories, post-processed, and either
goes to the replay buffer or to the consumer, and is counted. The resumable state
(counters, policy version, weights) has one format. The subclass says where its policy lives
and how its version is kept, and adds what only it has (RNG state, trajectory ids).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from .._core._ragged import dense_parts
from .._core._threads import to_thread

__all__ = ["BatchPipeline"]


class BatchPipeline:
    """Mixin of `CollectorLifecycle` (not public): post-processing, delivery, state."""

    _cfg: Any  # a CollectorConfig: storing_device, split_trajs, postproc
    _batch_rb: Any
    _torchrl_rb: Any  # a TorchRLBufferSink, or None
    _traj: Any  # a TrajectoryAssembler handing finished trajectories over one by one, or None
    _extend_buffer: bool
    _traj_options: tuple[int | None, str | None, int | None]  # trajs_per_batch, traj_format, trajs_per_write
    _frames: int
    _batches: int
    _hidden: tuple[Any, ...] = ()  # columns kept for the collector, left out of delivered batches

    # -- hooks -------------------------------------------------------------------------------
    def _count(self, frames: int, seconds: float) -> None:
        raise NotImplementedError

    def _state_module(self) -> torch.nn.Module | None:
        """The ``nn.Module`` whose weights a `state_dict` saves (``None``: nothing to save)."""
        raise NotImplementedError

    def _set_policy_version(self, version: int) -> None:
        raise NotImplementedError

    def _policy_version(self) -> int:
        raise NotImplementedError

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state_dict: dict[str, Any]) -> None:
        """Restore what `_extra_state` saved (called after the common part)."""

    def _loaded_weights(self, state: dict[str, Any]) -> None:
        """The policy module was just loaded with ``state`` (workers may need them too)."""

    # -- the pipeline ------------------------------------------------------------------------
    def _without_hidden(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` without the columns the collector keeps for itself (and no empty "collector" left)."""
        if not self._hidden:
            return batch
        batch = batch.exclude(*self._hidden)
        group = batch.get("collector", None)
        if group is not None and group.is_empty():  # TorchRL's batch with track_traj_ids=False has none
            batch = batch.exclude("collector")
        return batch

    def _needs_post(self) -> bool:
        cfg = self._cfg
        return bool(cfg.split_trajs) or cfg.postproc is not None

    def _post(self, batch: TensorDictBase) -> TensorDictBase:
        """Storing device, then trajectories, then ``postproc`` (runs off the event loop)."""
        cfg = self._cfg
        if cfg.storing_device is not None and batch.device != cfg.storing_device:
            batch = batch.to(cfg.storing_device)
        if cfg.split_trajs:
            from ._split import split_trajectories

            batch = split_trajectories(batch, prefix="collector")
        if cfg.postproc is not None:
            batch = cfg.postproc(batch)
        return batch

    def _init_random(self) -> bool:
        """Whether this batch still uses random actions (``init_random_frames``)."""
        rb = getattr(self, "_rb", None)
        done = rb.write_count if rb is not None else self._frames
        return bool(done < self._cfg.init_random_frames)

    async def _deliver(
        self, batch: TensorDictBase, frames: int, start: float, *, post: bool, run: Callable[..., Any] = to_thread
    ) -> TensorDictBase | None:
        """Post-process (if ``post``, with ``run``), write to the buffer or return it, and count ``frames``."""
        batch = self._without_hidden(batch)
        if self._torchrl_rb is not None:
            await self._deliver_parts([batch], frames, start, post=post, run=run)
            return None
        if post:
            batch = await run(self._post, batch)
        if self._batch_rb is not None:
            for part in dense_parts(batch):  # batches the workers could not write themselves
                await self._batch_rb.extend(part)
            self._count(frames, time.perf_counter() - start)
            return None
        self._count(frames, time.perf_counter() - start)
        return batch

    async def _deliver_parts(
        self, parts: list[TensorDictBase], frames: int, start: float, *, post: bool, run: Callable[..., Any] = to_thread
    ) -> None:
        """Write each worker's ``[*B, T]`` batch to the TorchRL buffer, in order, and count ``frames``.

        Exactly what each of TorchRL's collector workers does with its own batch: post-process
        it (if ``post``), then one ``extend`` (``extend_buffer=True``), one ``add`` per time
        step (``extend_buffer=False``), or, with ``trajs_per_batch``, the trajectories it
        completed, as flat runs of frames, ``trajs_per_write`` per ``extend`` (default: all).
        """
        rb = self._torchrl_rb
        parts = [self._without_hidden(part) for part in parts]
        for part in parts:
            if post:
                part = await run(self._post, part)
            if self._traj is not None:
                self._traj.add(part)
                trajs = self._traj.pop_writes()  # one finished trajectory each
                k = self._traj_options[2] or max(1, len(trajs))
                groups = [trajs[i : i + k] for i in range(0, len(trajs), k)]
                await rb.extend_each([g[0] if len(g) == 1 else torch.cat(g, 0) for g in groups])
            elif self._extend_buffer:
                await rb.extend(part)
            else:
                await rb.add_steps(part)
        self._count(frames, time.perf_counter() - start)

    @staticmethod
    def _weights_argument(policy_or_weights: Any, weights: Any) -> Any:
        """The one weights source of ``update_policy_weights_(policy_or_weights, weights=)``."""
        if policy_or_weights is not None and weights is not None:
            raise ValueError("pass weights either positionally or as weights=, not both")
        return weights if weights is not None else policy_or_weights

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return the collector's resumable state: counters, policy version and weights.

        The in-process `Collector` adds its RNG state and next trajectory id.
        """
        module = self._state_module()
        return {
            "policy_state_dict": module.state_dict() if module is not None else None,
            "frames": self._frames,
            "batches": self._batches,
            "policy_version": self._policy_version(),
            **self._extra_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a `state_dict`: counters, policy version and weights (plus what the class adds)."""
        module = self._state_module()
        weights = state_dict.get("policy_state_dict")
        if weights is not None and module is not None:
            module.load_state_dict(weights)
            self._loaded_weights(weights)
        self._frames = int(state_dict["frames"])
        self._batches = int(state_dict["batches"])
        self._set_policy_version(int(state_dict["policy_version"]))
        self._load_extra_state(state_dict)

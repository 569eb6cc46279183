"""How the in-process `Collector` hands batches over besides yielding a fresh one each time.

Straight into a replay buffer's rows (no TensorDict around them), into the one storage every
batch reuses (``return_same_td``), or as a zero-filled batch of the right layout
(``fake_tensordict``). A mixin of `Collector`, whose rollout, lane and buffer these use.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from tensordict import TensorDictBase

from .._envs._base import AsyncBatchedEnv
from .._rollout._rollout import Rollout

__all__ = ["InProcessBatches"]


class InProcessBatches:
    """Mixed into `Collector` (see the module docstring)."""

    _rollout: Any
    _lane: Any
    _batch_rb: Any
    _same_out: Any
    _layout_checked: bool
    _paused: bool
    _bg_holding: bool
    _hidden: tuple[Any, ...]

    if TYPE_CHECKING:  # provided by CollectorLifecycle, later in Collector's bases: never shadow them here

        async def _ensure_started(self) -> None: ...
        def _count(self, frames: int, seconds: float) -> None: ...
        def _needs_post(self) -> bool: ...
        def _post(self, batch: TensorDictBase) -> TensorDictBase: ...
        def _without_hidden(self, batch: TensorDictBase) -> TensorDictBase: ...

    def _collect_same(self, rollout: Any, random: bool) -> TensorDictBase:
        """One batch in the storage every batch reuses (``return_same_td``): no copy is made."""
        if hasattr(rollout, "collect_same"):  # a TorchRL env's rollout owns its batch TensorDict
            return rollout.collect_same(random)
        if self._same_out is None:
            self._same_out = rollout.collect(random)
        else:
            rollout.collect(random, dict(self._same_out.items(include_nested=True, leaves_only=True)))
        return self._same_out

    async def _collect_into_buffer(self, rollout: Rollout, random: bool, start: float) -> None:
        rb = self._batch_rb
        shape = (*rollout.B, rollout.T)
        if not self._layout_checked:
            rb.storage.check_layout([(k, s[len(shape) :], d) for k, s, d in rollout.output_layout()])
            self._layout_checked = True
        res = await rb.reserve(math.prod(shape), shape)
        if self._paused:  # paused while waiting for room: hold nothing, write nothing
            rb.abort(res)
            return None
        self._bg_holding = True
        try:
            views = rb.storage.views(res.pieces, shape)
            if isinstance(rollout.env, AsyncBatchedEnv):
                batch = await rollout.acollect(random, self._lane.run, out=views)
            elif views is not None:  # straight into the buffer's rows, no TensorDict around them
                await self._lane.run(rollout.collect_into, random, views)
            else:
                batch = await self._lane.run(rollout.collect, random, None)
            if views is None:  # the rows wrap around the end of the ring: copy in two pieces
                leaves = batch.items(include_nested=True, leaves_only=True)
                rb.storage.write(res.pieces, {k: v.reshape(res.n, *v.shape[len(shape) :]) for k, v in leaves})
        except BaseException:
            rb.abort(res)
            raise
        finally:
            self._bg_holding = False
        rb.commit(res)
        self._count(res.n, time.perf_counter() - start)

    async def fake_tensordict(self) -> TensorDictBase:
        """A zero-filled batch with the keys, shapes, dtypes and names of the ones this collector yields.

        Builds (and resets) the env if the collector has not started yet. Useful to allocate
        storage or warm up a compiled loss before collecting (TorchRL's ``fake_tensordict``).
        """
        await self._ensure_started()
        rollout = self._rollout
        fake = getattr(rollout, "fake_batch", None)
        if fake is None or isinstance(getattr(rollout, "env", None), AsyncBatchedEnv):
            raise NotImplementedError("fake_tensordict() is not available for async envs; collect one batch instead")
        batch = await self._lane.run(fake)
        batch = self._without_hidden(batch)
        return await self._lane.run(self._post, batch) if self._needs_post() else batch

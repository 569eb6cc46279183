"""An `AsyncBatchedEnv` driven from synchronous code, on an event loop of its own.

Worker processes (and inline worker threads) step their env from a plain loop: there an
async env (an `AsyncEnvPool` of coroutine envs) gets a private event loop in a thread, and
each reset or step is one call into it. The envs' waits still overlap with each other on
that loop, the worker's policy runs in the worker's own thread, and the env's connections
are opened and closed on the one loop that owns them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ._base import AsyncBatchedEnv, BatchedEnv, StepArrays, StepOut
from ._specs import NestedKey

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = ["OwnLoopEnv"]


class OwnLoopEnv(BatchedEnv):
    """Run ``env``'s coroutines on a private event loop (asyncio, with uvloop when installed).

    Args:
        env: The async env; `close` awaits its ``aclose()`` on that loop, then stops the loop.
    """

    def __init__(self, env: AsyncBatchedEnv) -> None:
        from anyio.from_thread import start_blocking_portal

        self.env = env
        self.spec = env.spec
        options = {"use_uvloop": importlib.util.find_spec("uvloop") is not None}
        self._portal_cm = start_blocking_portal("asyncio", options)
        self._portal = self._portal_cm.__enter__()
        self._closed = False

    @property
    def counters(self) -> Any:
        """The wrapped env's counters (an `AsyncEnvPool`'s), if it has any."""
        return getattr(self.env, "counters", None)

    def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        """Reset through the env's loop; see `BatchedEnv.reset`."""
        return self._portal.call(self.env.reset, mask, seeds)

    def step(self, action: TensorDictBase) -> TensorDictBase:
        """Step through the env's loop; see `BatchedEnv.step`."""
        return self._portal.call(self.env.step, action)

    def _reset_arrays(self, mask: Any, seeds: Sequence[int] | None) -> dict[NestedKey, torch.Tensor]:
        return self._portal.call(self.env._reset_arrays, mask, seeds)

    def _step_arrays(self, action: dict[NestedKey, torch.Tensor], out: StepOut | None = None) -> StepArrays:
        return self._portal.call(self.env._step_arrays, action)

    def close(self) -> None:
        """Close the env on its loop, then stop the loop (its thread is joined)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self.env.aclose)
        finally:
            self._portal_cm.__exit__(None, None, None)

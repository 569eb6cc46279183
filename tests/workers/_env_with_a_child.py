"""An env that starts a process of its own, for the tests of workers' descendants (and their scripts)."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

from _grandchild import run_forever

from aiocollect.testing import CountingEnv


class EnvWithAChild(CountingEnv):
    """A `CountingEnv` that starts a ``multiprocessing`` child, which its `close` leaves running.

    The child never ends on its own (`run_forever`). ``method`` is the child's start method.
    """

    def __init__(self, method: str = "fork", hang_on_close: bool = False) -> None:
        super().__init__(1, episode_length=10**9)
        self.hang_on_close = hang_on_close
        ctx: Any = multiprocessing.get_context(method)
        ready = ctx.Event()
        self.child = ctx.Process(target=run_forever, args=(ready,), name="env child")
        self.child.start()
        if not ready.wait(60):
            raise RuntimeError("the env's child did not start within 60 s")

    def close(self) -> None:
        """Leave the child running (a leaky env); block forever with ``hang_on_close``."""
        if self.hang_on_close:
            threading.Event().wait()
        super().close()


def env_with_a_child(method: str = "fork", hang_on_close: bool = False) -> Any:
    """A factory of `EnvWithAChild` (one for each worker)."""
    return lambda: EnvWithAChild(method, hang_on_close)

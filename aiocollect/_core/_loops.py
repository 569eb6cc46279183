"""Which event loop is running in this thread, and how to wake it from another thread.

anyio 4.16 dropped its sniffio dependency, so aiocollect asks the loops themselves: asyncio
(uvloop included) through ``asyncio.get_running_loop`` and trio through its token. Both
return a callable that schedules a plain function on that loop from any thread, without
waiting for it to run.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["current_scheduler", "in_event_loop"]

Scheduler = Callable[[Callable[[], Any]], Any]


def current_scheduler() -> Scheduler | None:
    """A thread-safe ``call_soon`` for the loop running in this thread, or ``None``."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")  # never imported here: a trio loop has imported it already
    if trio is not None:
        try:
            return trio.lowlevel.current_trio_token().run_sync_soon
        except RuntimeError:
            pass
    return None


def in_event_loop() -> bool:
    """Whether this thread is running an asyncio or trio event loop right now."""
    return current_scheduler() is not None

"""Python's cyclic garbage collector kept off the objects that exist before a large pool runs.

With a thousand coroutine envs in flight, each env step holds a score of container objects
(its coroutines, task, future, timer) while it waits, enough of them outlive the young
collections that CPython 3.11 runs a full collection every few batch steps, and a full
collection scans every object of the process (torch alone brings ~300k): 150-200 ms during
which the event loop runs nothing. ``gc.freeze()`` moves the objects that exist now out of
the collector's sight, so later collections scan only what came after.

Freezing is process-wide, so it is counted: the first pool to start freezes, the last one to
close unfreezes, and only if the process had frozen nothing of its own before. "Nothing"
is what the interpreter froze itself, read when aiocollect is imported: 0 on most
Pythons, but 3.12.1 starts with 375 immortal tuples in the permanent generation, and
comparing with 0 there left every pool's freeze in place for good. Frozen objects
are still freed when their reference count drops; only reference cycles among them wait for
the unfreeze, so memory never grows past what the frozen objects already held.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["hold", "release"]

_lock = threading.Lock()
_holders = 0
_unfreeze_at_last_release = False
# Read at `import aiocollect` (the package imports this module): later freezes, a fork
# server's or the user's own, are then told apart from the interpreter's.
_INTERPRETER_FROZEN = gc.get_freeze_count()


def hold() -> None:
    """Freeze the objects alive now (a young collection first, so fresh garbage is not frozen)."""
    global _holders, _unfreeze_at_last_release
    with _lock:
        if _holders == 0:
            _unfreeze_at_last_release = gc.get_freeze_count() <= _INTERPRETER_FROZEN
        _holders += 1
        gc.collect(1)
        gc.freeze()


def release() -> None:
    """Undo one `hold`; the last one unfreezes, unless the process had frozen objects itself."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0 and _unfreeze_at_last_release:
            gc.unfreeze()

"""Run one coroutine per env row concurrently, with as little per-row overhead as each backend allows.

`AsyncEnvPool` steps every env of its batch at once. A task per env and step is the unit of
concurrency, so its cost is the pool's overhead: under asyncio (and uvloop) the rows run as
plain ``loop.create_task`` tasks awaited together, and under trio in a plain nursery: a
fraction of the cost of an anyio task group's. Either way the call is structured: it
returns only once every row's task has ended, and cancelling it cancels them all and waits
for them.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import anyio

from .._core._errors import warn_user

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

__all__ = ["cancel_and_wait", "each", "open_task_group"]


async def each(fn: Callable[[int], Coroutine[Any, Any, None]], rows: Iterable[int], grace: float = 10.0) -> None:
    """Run ``fn(i)`` for every row concurrently; a single failure is raised as itself.

    Several failures are raised together in a ``BaseExceptionGroup``. One env's error (say, an
    observation of the wrong shape) reads better, and is caught by ``except ValueError``, on
    its own. Rows cancelled (the call was, or another row failed) get ``grace`` seconds to
    end; under asyncio one that ignores its cancellation longer is left running, with a
    warning, so that shutdown stays bounded.
    """
    try:
        loop = asyncio.get_running_loop()  # asyncio or uvloop; trio has none
    except RuntimeError:
        await _each_in_group(fn, rows)
    else:
        await _each_asyncio(loop, fn, rows, grace)


def open_task_group() -> Any:
    """Outside asyncio: a trio nursery (anyio's task group wraps each of its tasks in more
    bookkeeping, ~10x the cost of a plain task per env step), or an anyio task group."""
    trio = sys.modules.get("trio")  # a running trio loop has imported it
    return trio.open_nursery() if trio is not None else anyio.create_task_group()


async def _each_asyncio(
    loop: asyncio.AbstractEventLoop, fn: Callable[[int], Coroutine[Any, Any, None]], rows: Iterable[int], grace: float
) -> None:
    tasks = [loop.create_task(fn(i)) for i in rows]
    if not tasks:
        return
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        # Cancelled from outside, or a row failed: the others are cancelled, and awaited
        # (shielded, so a cancel scope that keeps cancelling this task cannot cut it short,
        # and bounded, so an env that swallows its cancellation cannot hang shutdown).
        await cancel_and_wait([t for t in tasks if not t.done()], grace, "env step(s) or reset(s) of an AsyncEnvPool")
    errors = [t.exception() for t in tasks if not t.cancelled() and t.exception() is not None]
    _raise(errors)


async def cancel_and_wait(tasks: list[asyncio.Task[Any]], grace: float, what: str) -> None:
    """Cancel plain asyncio ``tasks`` and wait for them, shielded, at most ``grace`` seconds.

    One that ignores its cancellation longer is left running on the loop, with a warning that
    says how many (``what`` names them), so that shutdown stays bounded.
    """
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    with anyio.move_on_after(grace, shield=True):
        await asyncio.wait(tasks)
    left = sum(not t.done() for t in tasks)
    if left:
        warn_user(
            f"{left} {what} ignored cancellation for {grace}s (the collector's shutdown_timeout); they were "
            "left running on the event loop",
            RuntimeWarning,
        )


async def _each_in_group(fn: Callable[[int], Coroutine[Any, Any, None]], rows: Iterable[int]) -> None:
    """In `open_task_group`'s group."""
    error: Exception | None = None
    try:
        async with open_task_group() as group:
            for i in rows:
                group.start_soon(fn, i)
    except BaseExceptionGroup as eg:
        error = _single(eg)
    if error is not None:
        raise error  # outside the except block: the error keeps its own __cause__/__context__


def _single(group: BaseExceptionGroup) -> Exception:
    """The group's one error, to raise on its own; anything else (a cancellation) re-raises the group."""
    if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
        return group.exceptions[0]
    raise group


def _raise(errors: list[Any]) -> None:
    if not errors:
        return
    if len(errors) == 1 and isinstance(errors[0], Exception):
        raise errors[0]
    raise BaseExceptionGroup("several envs of an AsyncEnvPool failed", errors)

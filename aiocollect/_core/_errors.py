"""The aiocollect exception hierarchy: one base class, documented triggers."""

from __future__ import annotations

import sys
from typing import Any

__all__ = [
    "AiocollectError",
    "BufferClosedError",
    "BufferEmptyError",
    "BufferStarvedError",
    "BufferTimeoutError",
    "CollectorClosedError",
    "EnvOutputError",
    "EnvTimeoutError",
    "InferenceError",
    "InferenceServerClosedError",
    "PolicyOutputError",
    "StaleWeightsWarning",
    "WorkerCrashedError",
    "WorkerError",
    "WorkerTimeoutError",
    "WouldBlock",
    "add_note",
    "first_failure",
    "note_once",
    "warn_user",
]


class AiocollectError(Exception):
    """Base class of every error aiocollect raises on its own account."""


class CollectorClosedError(AiocollectError):
    """Raised when a collector is used after ``shutdown()``/``aclose()``."""


class WouldBlock(AiocollectError):
    """Raised when a ``*_nowait()`` call would have to wait."""


class BufferClosedError(AiocollectError):
    """Raised when a replay buffer is used after ``aclose()``/``close()``."""


class BufferEmptyError(WouldBlock, LookupError):
    """Raised when a replay buffer holds nothing that can be sampled yet (``sample_nowait()``)."""


class BufferStarvedError(AiocollectError, RuntimeError):
    """Raised when a replay-buffer wait can never end: every collector writing into the buffer has finished.

    The message names what the call waited for, what the buffer holds and how each collector
    ended; when one failed, its error is attached as ``__cause__``.
    """


class BufferTimeoutError(AiocollectError, TimeoutError):
    """Raised when ``sample(timeout=...)`` or ``wait_for(..., timeout=...)`` waited that long in vain.

    The message gives the same account as `BufferStarvedError`: what the call waited for,
    what the buffer holds and which collectors still write into it.
    """


class InferenceError(AiocollectError, RuntimeError):
    """Raised in every request of a batch whose policy call failed; the policy's error is ``__cause__``."""


class InferenceServerClosedError(AiocollectError):
    """Raised when a request reaches an `InferenceServer` that was closed (or closes before answering)."""


class PolicyOutputError(AiocollectError, ValueError):
    """Raised when a policy's output does not match the environment's action spec."""


class StaleWeightsWarning(UserWarning):
    """Warned once, when collection ends, if it collected with weights the trainer had changed and never sent.

    aiocollect's workers and nodes (and an in-process collector's copy on another
    ``policy_device``) hold copies of the policy, updated by ``update_policy_weights_()``
    between batches. TorchRL's CPU workers read the trainer's parameters live, so a script
    written for them may never call it. The warning comes as a collection closes, if batches
    were collected after the trainer's module changed in place and no update was ever sent
    (not after a failure of the collection itself); the first update ends the watch. Filter it with
    ``warnings.filterwarnings("ignore", category=aiocollect.StaleWeightsWarning)`` where the
    workers keep their first weights on purpose.
    """


class EnvOutputError(AiocollectError, ValueError):
    """Raised when an environment returns an entry whose shape differs from the one its spec promises."""


class EnvTimeoutError(AiocollectError, TimeoutError):
    """Raised when an async env's step runs past its pool's ``step_timeout`` (the env is named)."""


class WorkerError(AiocollectError, RuntimeError):
    """Raised when a collector worker fails: its env or policy raised, it died, or it hung.

    Every worker failure is a `WorkerError`, so one ``except WorkerError`` catches them all;
    it is also a ``RuntimeError``, what TorchRL's collectors raise for a failed worker. A
    failure while the worker starts (building its env or policy) is also an instance of the
    original exception's built-in type (a ``TypeError`` from a policy that does not fit the
    env is caught by ``except TypeError``), as TorchRL re-raises start-up errors.
    When the worker's code raised, its original exception (with the worker's traceback) is
    attached as ``__cause__``. `WorkerCrashedError` (the process died without reporting an
    error) and `WorkerTimeoutError` (no progress within ``worker_timeout``) are subclasses.

    When several workers fail at once (the same bug in every worker, say), one error is
    raised, always a `WorkerError`: the one of the lowest worker id among those seen. The
    others are in its ``others`` attribute and listed in its notes.

    Attributes:
        worker_id: Index of the worker that failed.
        pid: Process id of the worker (the parent's pid for in-process workers).
        step: The worker's step at which the failure happened, or ``None``.
        others: Failures of other workers seen at the same time (oldest first).
    """

    def __init__(self, worker_id: int, pid: int | None, step: int | None, error: str) -> None:
        self.worker_id = worker_id
        self.pid = pid
        self.step = step
        self.others: tuple[BaseException, ...] = ()
        where = f" at step {step}" if step is not None else ""
        super().__init__(f"worker {worker_id} (pid {pid}) failed{where}: {error}")

    def __str__(self) -> str:
        # The message as given, also when combined with a type that formats its own (KeyError quotes it).
        return BaseException.__str__(self)


class WorkerCrashedError(WorkerError):
    """Raised when a worker process dies without reporting an error (signal, ``os._exit``).

    Attributes:
        worker_id: Index of the worker that died.
        pid: Its process id.
        exitcode: Its exit code (negative: the signal that killed it; ``None``: not known, for
            a process the trainer did not start itself).
    """

    def __init__(self, worker_id: int, pid: int | None, exitcode: int | None, *, during_startup: bool = False) -> None:
        self.exitcode = exitcode
        if exitcode is not None and exitcode < 0:
            import signal

            try:
                how = f"killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"killed by signal {-exitcode}"
        elif exitcode is None:  # a process the trainer did not start itself (a remote node, a Ray task)
            how = "ended or lost its connection, without an exit code"
        else:
            how = f"exited with code {exitcode}"
        hint = ""
        if during_startup:
            hint = (
                " during startup; if the main module creates the collector at import time, "
                'guard that code with `if __name__ == "__main__":`'
            )
        AiocollectError.__init__(self, f"worker {worker_id} (pid {pid}) {how}{hint}")
        self.worker_id, self.pid, self.step, self.others = worker_id, pid, None, ()


class WorkerTimeoutError(WorkerError):
    """Raised when a busy worker makes no progress for ``worker_timeout`` seconds.

    A worker makes progress with every env step and every command it handles; one that is
    stopped (``SIGSTOP``, a debugger) or blocked inside its env or policy makes none.

    Attributes:
        worker_id: Index of the stalled worker.
        pid: Its process id.
        step: The number of steps (and commands) it had made when it stalled.
        seconds: How long it had made no progress.
    """

    def __init__(
        self,
        worker_id: int,
        pid: int | None,
        step: int,
        seconds: float,
        timeout: float,
        state: str,
        restart_arg: str = "restart_workers",
    ) -> None:
        self.seconds = seconds
        unit = restart_arg.removeprefix("restart_")
        AiocollectError.__init__(
            self,
            f"worker {worker_id} (pid {pid}) made no progress for {seconds:.1f}s (worker_timeout={timeout:g}) "
            f"after step {step}: {state}; raise worker_timeout (None disables it) or set {restart_arg} "
            f"to restart stalled {unit}",
        )
        self.worker_id, self.pid, self.step, self.others = worker_id, pid, step, ()


def first_failure(failures: list[BaseException]) -> BaseException:
    """The one error to raise for ``failures`` seen together: the lowest worker id's, others attached."""
    ordered = sorted(failures, key=lambda e: getattr(e, "worker_id", float("inf")))
    first, rest = ordered[0], ordered[1:]
    if rest and isinstance(first, WorkerError):
        first.others = tuple(rest)
        note = "other workers failed too:\n" + "\n".join(f"  {type(e).__name__}: {e}" for e in rest)
        add_note(first, note)
    return first


class _RemoteTraceback(Exception):
    """The worker's formatted traceback, attached as ``__cause__`` (as concurrent.futures does)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def worker_error_from_message(worker_id: int, pid: int | None, msg: Any) -> WorkerError:
    """Build the `WorkerError` for a worker's ``Failed`` record (step, exception, summary, traceback)."""
    import pickle

    step, payload, text, tb = msg.step, msg.exception, msg.summary, msg.traceback
    original: BaseException | None = None
    if payload is not None:
        try:
            original = pickle.loads(payload)
        except Exception:
            original = None
    kind = _start_up_kind(type(original)) if original is not None and step is None else WorkerError
    err = kind(worker_id, pid, step, str(text))
    cause = _RemoteTraceback(str(tb))
    if original is not None:
        original.__cause__ = cause
        err.__cause__ = original
    else:
        err.__cause__ = cause
    return err


_KINDS: dict[type[BaseException], type[WorkerError]] = {}


def _start_up_kind(original: type[BaseException]) -> type[WorkerError]:
    """`WorkerError` that is also ``original`` (a plain built-in exception type), or `WorkerError` itself."""
    if original.__module__ != "builtins" or not issubclass(original, Exception) or issubclass(original, WorkerError):
        return WorkerError
    kind = _KINDS.get(original)
    if kind is None:
        try:
            kind = type(f"WorkerError[{original.__name__}]", (WorkerError, original), {"__module__": "aiocollect"})
        except TypeError:  # a built-in with its own instance layout (OSError, ...): no combination
            kind = WorkerError
        _KINDS[original] = kind
    return kind


def _internal_prefixes() -> tuple[str, ...]:
    import asyncio
    import contextlib
    import os
    import threading

    import anyio

    dirs = [os.path.dirname(os.path.abspath(m.__file__ or "")) for m in (anyio, asyncio)]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the aiocollect package
    return (here + os.sep, *(d + os.sep for d in dirs), contextlib.__file__ or "", threading.__file__ or "")


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` pointing at the user's line, however deep inside aiocollect it is called.

    Frames of aiocollect, anyio, asyncio, contextlib and threading are skipped (a fixed
    ``stacklevel`` is wrong as soon as a call path gets one frame deeper, and under
    ``anyio.run`` it lands in anyio's source). Where the user's frame is in another thread
    (a blocking twin's portal), the warning points at the outermost aiocollect frame.
    """
    import types
    import warnings

    skip = _internal_prefixes()
    frame: types.FrameType | None = sys._getframe(1)
    level, last = 2, 2
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip):
            break
        if name.startswith(skip[0]):
            last = level  # the outermost aiocollect frame so far
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else last)


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, on Python 3.10 too.

    Python 3.10 has no ``add_note``: the note goes into ``__notes__`` all the same, so that
    code reading it sees one thing on every version, and the traceback shows it there as on
    3.11 (the ``exceptiongroup`` backport, which anyio imports on 3.10, prints ``__notes__``).
    """
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]


def note_once(exc: BaseException, note: str) -> None:
    """Add ``note`` to ``exc`` (once): ``except`` clauses still see the exception's own type."""
    if note not in getattr(exc, "__notes__", ()):
        add_note(exc, note)
